"""``attach()``'s options, written once: names, defaults, documentation and their checks.

``attach``, ``Inspector`` and the Lightning and Hugging Face callbacks all take these options as keyword
arguments; ``AttachOptions`` checks them (at attach, or when a callback is made: not at the first check() or
the first logged step) and ``takes_attach_options`` shows them in each one's signature and help. A new option
is added here, as a field, its line in the docstring and, when it needs one, its check.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, TypeVar

from amp_inspect.core.formats import check_formats
from amp_inspect.diagnosis.history import COLLAPSE_SKIPS
from amp_inspect.distributed.combine import DEFAULT_TIMEOUT_S

if TYPE_CHECKING:
    import torch.distributed as dist

ACTIVATION_MODES = ("on_skip", "always", "off")
TRAINER_OPTIMIZER = "trainer"  # the callbacks' optimizer= when update_every is given: the trainer's optimizers


@dataclass(frozen=True)
class AttachOptions:
    """Options (keyword arguments):
        formats: formats to judge gradients against; the first one drives offenders, headroom and advice.
        every: full statistics every N steps (steps GradScaler skips in between are still inspected). An
            InspectingGradScaler inspects every step anyway, in its unscale pass, at no extra cost.
        log: a JSONL file, one record per inspected step (``amp_inspect.read_log`` reads it).
        activations: "on_skip" arms module hooks for a few steps after a skipped step to find the first module
            whose output or output gradient went non-finite or overflowed; "always" keeps them armed (a host
            sync per step); "off" never registers them.
        hist_every: per-module exponent histograms go into the log on steps divisible by N, and on the steps of
            an incident (a skipped or poisoned step, a gradient spike, and the 2 steps after each; at most 50 per
            run: amp_inspect.inspection._hist_schedule). 0: never.
        arm_steps: steps the activation hooks stay armed after a skipped step ("on_skip").
        collapse_skips: skipped steps in a row that count as a loss-scale collapse (a warning, the doctor's
            finding and the summary's advice).
        watch_clipping: record clip_grad_norm_ / clip_grad_value_ calls made while the gradients are still
            scaled (before scaler.unscale_): ``insp.doctor()`` reports them. Needs the scaler.
        readiness_every: every N-th step (a multiple of ``every``), measure what each FP8 / MXFP8 / MXFP4 / NVFP4
            recipe would lose on every Linear's GEMM operands (X, W, dY, dW): ``insp.readiness()``,
            ``report.readiness``, the log, ``amp-inspect readiness`` (docs/readiness.md). None: off.
        optimizer: the optimizer (or a list of optimizers) whose steps ``update_every`` measures (the Lightning
            and Hugging Face callbacks take the trainer's: leave it out there).
        update_every: every N-th step (a multiple of ``every``; the first optimizer step at or after it, under
            gradient accumulation or a skipped step), measure what ``optimizer.step()`` did: updates
            rounded away in the weights' dtype, Adam state underflow, the update-to-weight ratio per module
            (``insp.last_update``, ``report.update``, the log, the summary; docs/usage.md). Costs a copy of the
            parameters with gradients on those steps. None: off.

    Distributed runs (attach after ``init_process_group`` and after wrapping the model):
        group: the process group to combine FSDP2 shards over. Default: the shard group of their mesh. On a
            DDP model the hook always works over DDP's process group (a different group= is an error).
        timeout: seconds any wait for other ranks may take before a DistributedInspectionError (a rank died,
            or the ranks do not inspect the same steps or hold the same model). Host tensors (gloo) only: on
            CUDA tensors (NCCL) a timed wait would stall the host every step, so the process group's own
            timeout applies there.
        ddp_hook: on a DDP model, register ``amp_inspect.ddp_comm_hook`` so that reports name the rank and
            module that produced a NaN/Inf (``report.inf_by_rank``).
        log_all_ranks: write the log on every rank, rank r to ``<log stem>.rank<r><suffix>``; by default only
            rank 0 writes it (every rank's report is the same; with DDP over subgroups, the first rank of
            each group writes its group's, to ``<log stem>.rank<r><suffix>``).
    """

    formats: Sequence[str] = ("fp16",)
    every: int = 1
    log: str | os.PathLike[str] | None = None
    activations: str = "on_skip"
    hist_every: int = 100
    arm_steps: int = 3
    collapse_skips: int = COLLAPSE_SKIPS
    watch_clipping: bool = False
    group: dist.ProcessGroup | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    ddp_hook: bool = True
    log_all_ranks: bool = False
    readiness_every: int | None = None
    optimizer: Any = None
    update_every: int | None = None

    def __post_init__(self) -> None:
        _positive_int("every", self.every)
        if self.activations not in ACTIVATION_MODES:
            raise ValueError(f"activations must be one of {ACTIVATION_MODES}, got {self.activations!r}")
        timeout = self.timeout
        if isinstance(timeout, bool) or not (isinstance(timeout, int | float) and timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        hist_every = self.hist_every
        if isinstance(hist_every, bool) or not isinstance(hist_every, int):
            what = "steps between histograms; 0 turns them off"
            raise ValueError(f"hist_every must be an int ({what}), got {hist_every!r}")
        _positive_int("arm_steps", self.arm_steps)
        _positive_int("collapse_skips", self.collapse_skips)
        if self.readiness_every is not None:
            _positive_int("readiness_every", self.readiness_every)
            if self.readiness_every % self.every:
                raise ValueError(
                    f"readiness_every must be a multiple of every ({self.every}) so that readiness steps are inspected "
                    f"steps, got {self.readiness_every}"
                )
        if self.update_every is not None:
            _positive_int("update_every", self.update_every)
            if self.optimizer is None:
                raise ValueError("update_every needs the optimizer whose steps it measures: attach(..., optimizer=opt)")
            if self.update_every % self.every:
                raise ValueError(
                    f"update_every must be a multiple of every ({self.every}) so that measured steps are inspected "
                    f"steps, got {self.update_every}"
                )
        if self.optimizer is not None and self.optimizer != TRAINER_OPTIMIZER:
            from amp_inspect.updates.watch import optimizers_of  # imports torch: only when an optimizer is given

            object.__setattr__(self, "optimizer", tuple(optimizers_of(self.optimizer)))  # frozen: hashable
        if self.log is not None and not isinstance(self.log, str | os.PathLike):
            raise TypeError(f"log must be a path (str or os.PathLike) or None, got {type(self.log).__name__}")
        for name in ("watch_clipping", "ddp_hook", "log_all_ranks"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be True or False, got {value!r}")
        object.__setattr__(self, "formats", check_formats(self.formats))  # frozen: the checked tuple, once
        object.__setattr__(self, "timeout", float(timeout))

    def as_kwargs(self) -> dict[str, Any]:
        """The options as keyword arguments (for ``Inspector(model, scaler, **options.as_kwargs())``)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


Function = TypeVar("Function", bound=Callable[..., Any])


def takes_attach_options(function: Function) -> Function:
    """Marks ``function(..., **options)`` as taking AttachOptions: help() and editors that read signatures show
    each option, with its default, in place of ``**options``, and the options' documentation follows its own."""
    signature = inspect.signature(function)
    kept = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in fields(AttachOptions)
    ]
    function.__signature__ = signature.replace(parameters=[*kept, *options])  # type: ignore[attr-defined]
    own = inspect.cleandoc(function.__doc__ or "")
    function.__doc__ = "\n\n".join(part for part in (own, inspect.cleandoc(AttachOptions.__doc__ or "")) if part)
    return function
