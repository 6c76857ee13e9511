"""The GEMM operands of each Linear, measured for format readiness every N-th step (``attach(...,
readiness_every=N)``; issue 21, part B). readiness/report.py turns the statistics into the table and verdicts.

On a readiness step, and only then, hooks sit on every ``nn.Linear`` (subclasses included) and transformers'
``Conv1D`` (recognised by its class, so transformers is never imported):

- a forward pre-hook takes **X**, the module's input as given (under autocast, before the GEMM casts it), and
  **W**, its weight in the forward GEMM's layout: blocks along the reduction dimension, ``[out, in]`` (a Conv1D's
  ``[in, out]`` weight is measured transposed, a temporary copy);
- a forward hook registers a tensor hook on the output, which takes **dY**, the output's gradient, in backward;
- at the end of the step, **dW**, each hooked weight's ``.grad``.

Each tensor is measured on the fly with ``format_readiness`` (amp_inspect/core/format_readiness.py: every recipe at
once, in one fused pass) and only its statistics are kept: a module called twice in the step (gradient accumulation, a
shared layer) adds its statistics to its row (counts and sums add, amax the maximum), on the device, without a host
sync. Forwards without grad (evaluation) and tensors of other dtypes than float32/bfloat16/float16 are left out. A
tensor subclass is measured by the plain tensor holding its values (model/subclasses.py); one whose values no plain
tensor holds (a quantized-training weight: torchao's int8 weight) is not measured, said once per inspector in one
warning naming the module, the operand and the subclass (its module's row then holds X and dY, not W).
The hooks come at the start of a readiness step and leave at its end: the other steps run no hook at all.

A step is "the N-th" by the inspector's step number (step % N == 0, so step 0 is one). On a torch.compile'd model
the readiness step runs eagerly (probes/eager_stance.py, as the activation hooks do): compiled code does not call hooks
added after compiling. A readiness step whose hooks saw no forward at all (the loop calls a compiled wrapper the
inspector was not attached to) says so once (RuntimeWarning) instead of reporting an empty table.

Cost: on a readiness step, one ``format_readiness`` call per X, W, dY and dW of each module (plus a transposed copy
of each Conv1D weight); nothing on the other steps. bench/bench_step.py measures it (bench/README.md).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from amp_inspect.core.format_readiness import ReadinessStats, format_readiness
from amp_inspect.core.printable import shown_name
from amp_inspect.core.recipes import check_recipes
from amp_inspect.core.torch_compat import in_backward
from amp_inspect.distributed.combine import added_here, is_distributed, to_local, wait_all
from amp_inspect.gradients.step_report import HostCopy, StepReport
from amp_inspect.model.subclasses import plain_values, subclass_name
from amp_inspect.model.view import ModelView, is_gemm_module
from amp_inspect.probes.eager_stance import EagerHold
from amp_inspect.probes.probe import NOTHING, ReportParts
from amp_inspect.readiness.report import ReadinessReport

__all__ = ["ReadinessHooks", "ReadinessReport", "gemm_modules", "is_gemm_module", "weight_operand"]

READINESS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NOTHING_MEASURED = (
    "amp_inspect: the readiness hooks saw no forward pass on step {step} (does the loop call a torch.compile wrapper "
    "the inspector was not attached to? Attach the compiled model itself); that step has no readiness table"
)


def gemm_modules(model: nn.Module | ModelView) -> dict[nn.Module, str]:
    """Every GEMM module of ``model`` with its clean name (model/naming.py: wrappers looked through), each once."""
    return dict(ModelView.of(model).gemm_modules)


def weight_operand(module: nn.Module) -> torch.Tensor | None:
    """The weight as the forward GEMM reduces it, reduction dimension last: a Linear's ``[out, in]`` as stored, a
    Conv1D's ``[in, out]`` transposed (a copy); a tensor subclass by its plain values. None for a weight that is not
    a tensor, or a subclass whose values no plain tensor holds."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor) or (weight := plain_values(weight)) is None:
        return None
    weight = weight.detach()
    return weight if isinstance(module, nn.Linear) else weight.t().contiguous()


NOT_MEASURED = (
    "amp_inspect: readiness_every does not measure {named}: a tensor subclass whose values no plain tensor holds (its "
    "own dequantization makes them); the modules' other operands are measured"
)
# Operands a plain tensor holds alike on every rank of a data-parallel group (see _measure).
SAME_ON_EVERY_RANK = ("W", "dW")
SHOWN_OPERANDS = 10  # operands the warning names before "..."

NO_OPERAND = (
    "amp_inspect: the readiness hooks saw the forward pass on step {step} but no operand they can measure (float32, "
    "bf16 or fp16 GEMM inputs and weights: a float64 or complex model has none); that step has no readiness table"
)


MEASURE_FAILED = (
    "amp_inspect: the readiness hooks could not measure {operands} of {module} on step {step} ({error}); those "
    "operands are left out of the readiness table (in a distributed run: this rank's pieces of them add nothing to "
    "the table merged across ranks) (said once)"
)


def _measurable(t: object) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dtype in READINESS_DTYPES
        and t.layout == torch.strided
        and t.device.type != "meta"
        and t.numel() > 0
    )


@dataclass
class _Row:
    """One (module, operand)'s statistics of this step, on the device: readiness_report's row layout."""

    counts: torch.Tensor  # int64 [3 + 4R]
    sums: torch.Tensor  # float64 [1 + R]
    amax: torch.Tensor  # float32 []

    def add(self, other: _Row) -> None:
        self.counts += other.counts
        self.sums += other.sums
        torch.maximum(self.amax, other.amax, out=self.amax)


def _rows(stats: ReadinessStats) -> list[_Row]:
    """The rows of a ReadinessStats (fields [T, R]; per-tensor counts repeated across recipes), on its device."""
    s = stats
    counts = torch.cat(
        [s.numel[:, :1], s.nonzero[:, :1], s.nonfinite[:, :1], s.flushed, s.saturated, s.blocks, s.scale_flushed],
        dim=1,
    )
    sums = torch.cat([s.sq_signal[:, :1], s.sq_error], dim=1).to(torch.float64)
    amax = s.amax.to(torch.float32)
    return [_Row(counts[i], sums[i], amax[i].clone()) for i in range(counts.shape[0])]


class _PreHook:
    """A readiness forward pre-hook: X and W of one module. Holds its owner weakly; copies as a no-op."""

    __slots__ = ("_owner", "name")

    def __init__(self, owner: ReadinessHooks, name: str) -> None:
        self._owner = weakref.ref(owner)
        self.name = name

    def __call__(self, module: nn.Module, args: tuple) -> None:
        owner = self._owner()
        if owner is not None and args:
            owner._forward_input(self.name, module, args[0])

    def __reduce__(self) -> tuple[type, tuple]:
        return (_Inert, ())


class _PostHook(_PreHook):
    """A readiness forward hook: registers the output's gradient hook (dY)."""

    __slots__ = ()

    def __call__(self, module: nn.Module, args: tuple, output: object) -> None:  # type: ignore[override]
        owner = self._owner()
        if owner is not None:
            owner._forward_output(self.name, output)


class _Inert:
    def __call__(self, *args: object) -> None:
        return None


class ReadinessHooks:
    """An inspector's readiness hooks (``every`` None: off, nothing is ever registered) and their statistics.

    ``end_step(next_step, report, ...)`` is the one call per step: it closes a readiness step (dW, the table into the
    report) and opens the next one when it is due. ``last`` is the last readiness step's ReadinessReport."""

    def __init__(
        self,
        model: nn.Module | ModelView,
        every: int | None,
        owner: object,
        step: int,
        *,
        recipes: Iterable[str] | None = None,
        group: object = None,
        timeout: float = 300.0,
    ) -> None:
        self.view = ModelView.of(model)
        self.every = every
        self.recipes = check_recipes(recipes)
        self.group, self.timeout = group, timeout
        self.last: ReadinessReport | None = None
        self.step: int | None = None  # the readiness step the hooks are on (None: not armed)
        self._names: dict[nn.Module, str] = {}
        self._handles: list[RemovableHandle] = []
        self._tensor_handles: list[RemovableHandle] = []
        self._rows: dict[tuple[str, str], _Row] = {}
        self._forwards = 0  # training forwards of hooked modules in this readiness step
        self._calls = 0  # and calls of any kind (evaluation too): none at all means the hooks were bypassed
        self._inputs_seen: set[str] = set()  # modules whose X and W this step measured (recomputation: not twice)
        self._outputs_seen: set[str] = set()  # modules whose output gradient this step hooked
        self._eager = EagerHold()
        self._compiled = every is not None and self.view.compiled
        self._closed = False
        self._warned = False
        self._failed = False  # a measurement raised: said once, training goes on
        self._not_measured: dict[str, str] = {}  # "W of fc1" -> the subclass, this step's, said at its end
        self._said_not_measured: set[str] = set()  # those said already: once per inspector
        weakref.finalize(owner, self.close).atexit = False  # an inspector dropped without detach leaves no hook
        if every is not None:
            self._arm_if_due(step)

    @classmethod
    def of_options(
        cls, model: nn.Module | ModelView, options: Any, owner: object, step: int, group: object
    ) -> ReadinessHooks:
        """The hooks of an inspector's AttachOptions (``readiness_every``, ``timeout``), reporting over ``group``."""
        return cls(model, options.readiness_every, owner, step, group=group, timeout=options.timeout)

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    # ---- the step ----

    # The Probe protocol (probes/probe.py): nothing as a report is taken in; the table at the step's end.

    def annotate(self, report: StepReport) -> ReportParts:
        return NOTHING

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool = False) -> ReportParts:
        """The step before ``next_step`` ended: on a readiness step, dW of the hooked modules, the table made (the
        report's ``readiness`` when ``report`` is that step's), the hooks removed; then armed if ``next_step`` is
        due. No host sync (on CUDA the statistics go to pinned memory asynchronously)."""
        part: ReportParts = NOTHING
        if self.step is not None and self.step < next_step:
            measured = self._finish(self.step)
            if measured is not None:
                self.last = measured
                if report is not None and report.step == measured.step:
                    part = {"readiness": measured}
        if self.step is None or self.step < next_step:
            self._arm_if_due(next_step)
        return part

    def _arm_if_due(self, step: int) -> None:
        if self._closed or self.every is None or step % self.every != 0:
            return
        self.step = step
        self._rows = {}
        self._forwards = self._calls = 0
        self._inputs_seen, self._outputs_seen = set(), set()
        self.view.refresh()  # each readiness step: modules added since are measured too (walked only then)
        self._names = dict(self.view.gemm_modules)
        for module, name in self._names.items():
            self._handles.append(module.register_forward_pre_hook(_PreHook(self, name)))
            self._handles.append(module.register_forward_hook(_PostHook(self, name)))
        if self._compiled:
            self._eager.take()

    def _finish(self, step: int) -> ReadinessReport | None:
        """dW, then the rows as one table on their way to the host; the hooks removed."""
        forwards = self._forwards
        for module, name in self._names.items():
            grad = getattr(getattr(module, "weight", None), "grad", None)
            # FSDP2, tensor parallel: a DTensor, measured by _measure as this rank's shard, summed across ranks below
            grad = self._plain(name, "dW", grad) if forwards else None
            if _measurable(grad):
                self._measure(name, [("dW", grad if isinstance(module, nn.Linear) else grad.t())])  # type: ignore[union-attr]
        self._disarm()
        self._say_not_measured()
        if not forwards:
            if self._names and not self._calls and not self._warned:
                self._warned = True
                warnings.warn(NOTHING_MEASURED.format(step=step), RuntimeWarning, stacklevel=5)
            return None
        keys = list(self._rows)
        if not keys:  # every operand of another dtype (float64, complex): nothing to stack, said once
            if not self._warned:
                self._warned = True
                warnings.warn(NO_OPERAND.format(step=step), RuntimeWarning, stacklevel=5)
            return None
        rows = [self._rows[k] for k in keys]
        self._rows = {}
        counts = torch.stack([r.counts for r in rows])
        sums = torch.stack([r.sums for r in rows])
        amax = torch.stack([r.amax for r in rows])
        counts, sums, amax = self._across_ranks(counts, sums, amax)
        pending = HostCopy({"counts": counts, "sums": sums, "amax": amax}, counts.device)
        return ReadinessReport(self.recipes, step=step, pending=pending, keys=keys)

    def _across_ranks(
        self, counts: torch.Tensor, sums: torch.Tensor, amax: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """In a distributed run, every rank's statistics merged (counts and sums add, amax the maximum): two
        all-reduces, collective on readiness steps. Every rank must measure the same modules (the same model)."""
        import torch.distributed as dist

        group = self.group
        if not is_distributed(group):  # type: ignore[arg-type]
            return counts, sums, amax
        summed = torch.cat([counts.double().flatten(), sums.flatten()])
        works = [
            dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group, async_op=True),  # type: ignore[arg-type]
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group, async_op=True),  # type: ignore[arg-type]
        ]
        wait_all(works, self.timeout, "combining the readiness statistics", group, counts.device)  # type: ignore[arg-type]
        c, s = summed.split([counts.numel(), sums.numel()])
        return c.round().to(torch.int64).reshape(counts.shape), s.reshape(sums.shape), amax

    # ---- the hooks ----

    def _forward_input(self, name: str, module: nn.Module, x: object) -> None:
        if self.step is None:
            return
        self._calls += 1
        # A forward run inside backward is activation checkpointing's recomputation: counted only where the forward
        # itself was not (reentrant checkpointing runs it without grad, so its recomputation is the one seen).
        if not torch.is_grad_enabled() or (in_backward() and name in self._inputs_seen):
            return
        self._inputs_seen.add(name)
        self._forwards += 1
        self._plain(name, "W", getattr(module, "weight", None))  # a weight no plain tensor holds: said at the end
        operands = (("X", self._plain(name, "X", x)), ("W", weight_operand(module)))
        self._measure(name, [(op, t) for op, t in operands if _measurable(t)])  # one call for both

    def _forward_output(self, name: str, output: object) -> None:
        if self.step is None or not torch.is_grad_enabled() or (in_backward() and name in self._outputs_seen):
            return  # a recomputed output's gradient is the original's, whose hook measures dY once
        self._outputs_seen.add(name)
        if isinstance(output, torch.Tensor) and output.requires_grad and output.grad_fn is not None:
            self._tensor_handles.append(output.register_hook(self._gradient_hook(name, self.step)))

    def _gradient_hook(self, name: str, step: int) -> Callable[[torch.Tensor], None]:
        owner_ref = weakref.ref(self)

        def hook(grad: torch.Tensor) -> None:
            owner = owner_ref()
            if owner is not None and owner.step == step:
                values = owner._plain(name, "dY", grad)
                if _measurable(values):
                    owner._measure(name, [("dY", values)])  # type: ignore[list-item]
            return None

        return hook

    def _plain(self, name: str, operand: str, t: object) -> object:
        """``t`` by the plain tensor holding its values (model/subclasses.py); a tensor subclass whose values no plain
        tensor holds is noted, to be said at the step's end, and None returned; anything else as it is."""
        if not isinstance(t, torch.Tensor):
            return t
        values = plain_values(t)
        if values is None:
            self._not_measured.setdefault(f"{operand} of {shown_name(name)}", subclass_name(t))
        return values

    def _say_not_measured(self) -> None:
        """One warning for the operands this step could not measure and no step said before."""
        new = {key: kind for key, kind in self._not_measured.items() if key not in self._said_not_measured}
        self._not_measured = {}
        if not new:
            return
        self._said_not_measured.update(new)
        named = ", ".join(f"{key} ({kind})" for key, kind in list(new.items())[:SHOWN_OPERANDS])
        more = f" and {len(new) - SHOWN_OPERANDS} more" if len(new) > SHOWN_OPERANDS else ""
        warnings.warn(NOT_MEASURED.format(named=named + more), RuntimeWarning, stacklevel=6)

    def _measure(self, name: str, operands: list[tuple[str, torch.Tensor]]) -> None:
        """One format_readiness call over ``operands`` (contiguous: blocks run along the last dimension as given),
        each row added to the step's row of (name, operand)."""
        if not operands:
            return
        # A DTensor (tensor parallel weights, the inputs its hooks make DTensors, FSDP2's dW) is measured as this
        # rank's local piece: the op has no sharding rule, and the table adds every rank's pieces (_across_ranks).
        # One replicated along a dimension of its mesh is measured at coordinate 0 of it alone (the colwise layer's
        # input: counted once, not once per tensor-parallel rank); the others add a row of zeros.
        # A plain weight is the same on every rank (DDP's replicas, FSDP2's all-gathered weight), and so is a plain
        # dW after DDP's all-reduce: measured by the group's first rank alone, so the table counts the model's W once.
        # Rows are added in the operands' order whichever this rank measures: the merge adds them by position.
        counted = [self._counted_here(op, t) for op, t in operands]
        measured = [(op, t) for (op, t), here in zip(operands, counted, strict=True) if here]
        rows: Iterator[_Row] = iter(())
        if measured:
            tensors = [to_local(t).detach().contiguous() for _, t in measured]
            try:
                with torch.no_grad():
                    rows = iter(_rows(format_readiness(tensors, self.recipes)))
            except Exception as error:  # noqa: BLE001 - a probe never breaks the user's forward or backward
                if not self._failed:
                    self._failed = True
                    warnings.warn(
                        MEASURE_FAILED.format(
                            step=self.step,
                            module=name,
                            operands=", ".join(op for op, _ in measured),
                            error=f"{type(error).__name__}: {error}",
                        ),
                        RuntimeWarning,
                        stacklevel=2,
                    )
                if not is_distributed(self.group):  # type: ignore[arg-type]
                    operands = [(op, t) for (op, t), here in zip(operands, counted, strict=True) if not here]
                # Across ranks, zero rows in their place: every rank must hold the same rows for the merge (a
                # missing row on one rank would shift every later one), so this rank's pieces add nothing.
                counted = [False] * len(operands)
        for (operand, t), here in zip(operands, counted, strict=True):
            self._add_row(name, operand, next(rows) if here else self._zero_row(t.device))

    def _counted_here(self, operand: str, t: torch.Tensor) -> bool:
        """Whether this rank adds its ``operand`` to the table merged across ranks (see _measure)."""
        if not added_here(t):
            return False
        if operand not in SAME_ON_EVERY_RANK or to_local(t) is not t or not is_distributed(self.group):  # type: ignore[arg-type]
            return True
        import torch.distributed as dist

        return dist.get_rank(self.group) == 0  # type: ignore[arg-type]

    def _add_row(self, name: str, operand: str, row: _Row) -> None:
        key = (name, operand)
        if key in self._rows:
            self._rows[key].add(row)
        else:
            self._rows[key] = row

    def _zero_row(self, device: torch.device) -> _Row:
        """A row that adds nothing (every rank must hold the same rows for the merge across ranks)."""
        recipes = len(self.recipes)
        return _Row(
            torch.zeros(3 + 4 * recipes, dtype=torch.int64, device=device),
            torch.zeros(1 + recipes, dtype=torch.float64, device=device),
            torch.zeros((), dtype=torch.float32, device=device),
        )

    # ---- removal ----

    def _disarm(self) -> None:
        for handle in self._handles + self._tensor_handles:
            handle.remove()
        self._handles.clear()
        self._tensor_handles.clear()
        self.step = None
        self._eager.release()

    def close(self) -> None:
        """Removes every hook for good (the Inspector's detach); later steps are not measured."""
        self._closed = True
        self._disarm()
        self._rows = {}
