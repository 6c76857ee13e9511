"""What ``optimizer.step()`` did, measured on every N-th step (``attach(..., optimizer=opt, update_every=N)``;
issue 22). updates/report.py turns the statistics into ``UpdateStats`` and its verdicts; core/update_stats.py is the op.

On a measured step, and only then, the optimizer's step hooks (``register_step_pre_hook`` /
``register_step_post_hook``, one pair per optimizer) do this:

- before the step (for a step given a closure, as Lightning's and LBFGS's are: after the closure's first call, which
  makes the gradients; a check() inside the closure, which LBFGS calls several times per step, is an inspected step
  within the optimizer step: the update is the whole step's, on the step of its first check()): a snapshot of every
  parameter of the optimizer that has a gradient (``p.detach().clone()``, in the parameter's own dtype; an FSDP2
  DTensor by this rank's shard), and a reference to its gradient as the optimizer sees it: after GradScaler's unscale,
  which ``scaler.step`` makes before it calls ``optimizer.step``;
- after the step: one ``update_stats`` pass per device over (before, after, gradient, and Adam's ``exp_avg_sq``
  where the optimizer state holds it: Adam, AdamW, foreach and fused alike), then the snapshot is dropped.

Memory: the snapshot is one extra copy of the parameters with gradients, in their dtype (2 bytes per bf16 / fp16
element, 4 per fp32), held from the start of the measured step's ``optimizer.step()`` to its end; nothing on other
steps. No host sync: the statistics go to the host as report.HostCopy copies them (pinned memory on CUDA).

Which steps: the optimizer step is the unit, so with gradient accumulation the step that applies the accumulated
gradients is measured. An optimizer step is measured when the inspector inspected its step (``check()``, or an
InspectingGradScaler's unscale pass; ``UpdateListener`` says which step runs) and it is the first optimizer step at
or after a step whose number is a multiple of N: with check() on every micro-batch the steps that apply may never
be multiples of N, and a step GradScaler skipped moves the measurement to the next step rather than losing it.
A step GradScaler skips never calls ``optimizer.step`` (a skipped step changed nothing: it is no lost update); a
fused optimizer's step under GradScaler is called with ``found_inf`` and applies nothing when it is set: its
statistics are marked skipped on the device (no sync) and left out. With a fused optimizer the gradients are still
scaled when the step runs (the fused kernel unscales them): finite and nonzero are judged on those.

Several optimizers each have their hooks; their statistics merge by module into one UpdateStats per step. FSDP2:
each rank measures its shards and the counts and sums are added across the shard group (amax the maximum), two
all-reduces in the measured step, as the gradient statistics are combined (distributed/combine.py). A DDP model's
replicas are not summed (every rank holds the same parameters).
"""

from __future__ import annotations

import math
import numbers
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch.utils.hooks import RemovableHandle

from amp_inspect.core.statistics import SUM, UPDATE_OUTPUTS
from amp_inspect.core.update_stats import INPUT_DTYPES, update_stats
from amp_inspect.distributed.combine import ShardGroups, combined_over, local_shards, to_local
from amp_inspect.gradients.step_context import LOW_PRECISION
from amp_inspect.gradients.step_report import HostCopy, StepReport
from amp_inspect.model.subclasses import plain_values
from amp_inspect.scaling.scaler import InspectingGradScaler
from amp_inspect.updates.report import UpdateStats

__all__ = ["OptimizerWatch", "UpdateListener", "UpdateStats", "optimizers_of"]


class UpdateListener(Protocol):
    """What the watch needs from its inspector: which step runs, and the module of a parameter."""

    step: int  # the step the next check() inspects
    last_report: StepReport | None

    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...

    def module_of(self, param: torch.Tensor) -> str | None: ...


def optimizers_of(optimizer: object) -> list[torch.optim.Optimizer]:
    """The ``optimizer=`` option as a list (None: none; one optimizer or several); TypeError for anything else."""
    if optimizer is None:
        return []
    items = [optimizer] if isinstance(optimizer, torch.optim.Optimizer) else optimizer
    try:
        items = list(items)  # type: ignore[call-overload]
    except TypeError:
        items = [optimizer]
    out = []
    for item in items:
        if not isinstance(item, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer or a list of them, got {type(item).__name__}")
        # accelerate's AcceleratedOptimizer (also the HF Trainer's) wraps the optimizer whose step() runs the hooks.
        inner = getattr(item, "optimizer", None)
        chosen = inner if isinstance(inner, torch.optim.Optimizer) else item
        if all(chosen is not o for o in out):  # named twice (or once wrapped, once not): hooked once
            out.append(chosen)
    return out


@dataclass
class _Snapshot:
    """One optimizer's parameters before its step: the parameters, their copies, their gradients, their names."""

    step: int
    params: list[torch.Tensor]
    before: list[torch.Tensor]
    grads: list[torch.Tensor]
    names: list[str]
    # False where the parameter's group has learning rate 0 (the step was asked to change nothing); a device flag
    # where the learning rate is a tensor on the parameter's device, read with the statistics (``_asked_to_move``)
    asked: list[bool | torch.Tensor]


@dataclass
class _Slot:
    """One measured step: its UpdateStats (filled by each optimizer's post hook) and the optimizers that stepped."""

    stats: UpdateStats
    stepped: set[int] = field(default_factory=set)


class _Hook:
    """A step hook of the watch: holds it weakly (an inspector dropped without detach leaves hooks that do nothing)
    and pickles as a no-op."""

    __slots__ = ("_watch", "_after")

    def __init__(self, watch: OptimizerWatch, after: bool) -> None:
        self._watch = weakref.ref(watch)
        self._after = after

    def __call__(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        if torch.compiler.is_compiling():
            # A compiled optimizer.step (torch.compile(opt.step), the recipe for a fast step): the hook runs eagerly,
            # outside the graph. Traced, it would guard on the step number and break the graph where it reads the
            # learning rate, with a warning to the user each time.
            return _eagerly()(self, optimizer, args, kwargs)
        return self._run(optimizer, args, kwargs)

    def _run(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        watch = self._watch()
        if watch is None or watch.every is None:
            return None
        if self._after:
            return watch._safely(watch._after_step, optimizer)
        return watch._safely(watch._before_step, optimizer, args, kwargs)

    def __reduce__(self) -> tuple[type, tuple]:
        return (_Inert, ())


_EAGER_RUN: Callable[..., Any] | None = None


def _eagerly() -> Callable[..., Any]:
    """``_Hook._run`` under ``torch.compiler.disable``, made on the first call from a compiled region (so that
    importing torch._dynamo, a second, is paid only by those who compile)."""
    global _EAGER_RUN
    if _EAGER_RUN is None:
        _EAGER_RUN = torch.compiler.disable(_Hook._run)
    return _EAGER_RUN


class _Inert:
    def __call__(self, *args: object) -> None:
        return None


class OptimizerWatch:
    """An inspector's hooks on its optimizers (``every`` None or no optimizer: off, nothing registered).

    ``end_step(next_step, report)`` is the one call per step: the report of a measured step waits for its
    statistics (its log line carries them). ``last``: the last measured step's UpdateStats."""

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        every: int | None,
        owner: UpdateListener,
        *,
        group: Any = None,
        timeout: float = 300.0,
    ) -> None:
        self.every = every if optimizers else None
        self.optimizers = list(optimizers) if self.every is not None else []
        self.group, self.timeout = group, timeout
        self.last: UpdateStats | None = None
        self._owner = weakref.ref(owner)
        self._snapshots: dict[int, _Snapshot] = {}
        self._slots: dict[int, _Slot] = {}
        self._handles: list[RemovableHandle] = []
        self._warned: set[str] = set()  # why parameters were left out, each said once
        self._measured: int | None = None  # the last step whose optimizer step was measured
        # Closures of a measured optimizer step running now: a check() inside one (LBFGS calls it several times per
        # step, each check() an inspected step) is within that optimizer step, which is not over yet.
        self._in_closure = 0
        for optimizer in self.optimizers:
            self._handles.append(optimizer.register_step_pre_hook(_Hook(self, after=False)))
            self._handles.append(optimizer.register_step_post_hook(_Hook(self, after=True)))
        weakref.finalize(owner, self.close).atexit = False

    @classmethod
    def of_options(cls, options: Any, owner: UpdateListener) -> OptimizerWatch:
        """The watch of an inspector's AttachOptions (``optimizer``, ``update_every``, ``group``, ``timeout``)."""
        return cls(
            optimizers_of(options.optimizer), options.update_every, owner, group=options.group, timeout=options.timeout
        )

    # ---- which step ----

    def _running_step(self) -> int | None:
        """The number of the step whose optimizer step runs now, when the inspector inspected it; else None."""
        owner = self._owner()
        if owner is None or self.every is None:
            return None
        scaler = owner.scaler
        if isinstance(scaler, InspectingGradScaler):
            return scaler.steps  # its unscale pass inspected this step; the report reaches the inspector at update()
        report = owner.last_report
        return report.step if report is not None and report.step == owner.step - 1 else None

    def _due(self, step: int) -> bool:
        """Whether an optimizer step that runs in ``step`` is measured: the first one at or after each multiple of
        ``every`` (a check() on every micro-batch of an accumulation, or a step GradScaler skipped, moves the
        measurement to the next optimizer step instead of losing it), and every optimizer's of the step measured."""
        latest = step - step % self.every  # type: ignore[operator]
        return self._measured is None or latest > self._measured or step == self._measured

    def _slot(self, step: int) -> _Slot:
        slot = self._slots.get(step)
        if slot is None:
            slot = self._slots[step] = _Slot(UpdateStats(step, complete=False))
        return slot

    # The Probe protocol (probes/probe.py): nothing as a report is taken in; the UpdateStats at the step's end.

    def annotate(self, report: StepReport) -> dict[str, Any]:
        return {}

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool = False) -> dict[str, Any]:
        """The step before ``next_step`` ended its check() (or its scaler's update(): ``optimizer_done``, its
        optimizer steps ran or were skipped): steps before it are over (their statistics complete: an optimizer
        step that never came was skipped), and the report of a measured step holds its UpdateStats, so that its log
        line waits for them (after update(), no longer than that: a step GradScaler skipped is complete there)."""
        # An optimizer step whose closure runs this check() is still going: its snapshot and its step's statistics
        # stay until its post hook (the whole step measured, on the step of its first check()).
        running = {snap.step for snap in self._snapshots.values()} if self._in_closure else set()
        for step in [s for s in self._slots if s < next_step - 1 and s not in running]:
            self._complete(self._slots.pop(step))
        # A step that raised inside optimizer.step() never ran its post hook: its copy of the parameters goes now.
        for key in [k for k, snap in self._snapshots.items() if snap.step < next_step - 1 and snap.step not in running]:
            del self._snapshots[key]
        part: dict[str, Any] = {}
        this_step = self.every is not None and report is not None and report.step == next_step - 1
        within = any(report.step > step for step in running) if this_step else False  # type: ignore[union-attr]
        if this_step and not within and self._due(report.step):  # type: ignore[union-attr]
            part = {"update": self._slot(report.step).stats}  # type: ignore[union-attr]
        if optimizer_done and next_step - 1 in self._slots:
            self._complete(self._slots.pop(next_step - 1))
        return part

    def _complete(self, slot: _Slot) -> None:
        if not slot.stats.complete:
            slot.stats.complete = True
        if slot.stepped:
            self.last = slot.stats

    # ---- the hooks ----

    def _before_step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """The snapshot, now; or, for a step given a closure (Lightning's, LBFGS), once the closure's first call has
        made the gradients (and the check() the loop makes inside it): the step's arguments with the closure wrapped."""
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0] is the optimizer
        if not callable(closure):
            self._snapshot(optimizer)
            return None

        first_call = True

        def measured_closure() -> Any:
            nonlocal first_call
            self._in_closure += 1
            try:
                loss = closure()
            finally:
                self._in_closure -= 1
            if first_call and self.every is not None:  # LBFGS calls it again mid-step: the snapshot is the first's
                first_call = False
                self._safely(self._snapshot, optimizer)
            return loss

        if "closure" in kwargs:
            return args, {**kwargs, "closure": measured_closure}
        return (args[0], measured_closure, *args[2:]), kwargs

    def _snapshot(self, optimizer: torch.optim.Optimizer) -> None:
        step = self._running_step()
        if step is None or not self._due(step):
            return
        if id(optimizer) in self._slot(step).stepped:
            return  # measured once per optimizer and step (a second step() call of the same step is not)
        owner = self._owner()
        params: list[torch.Tensor] = []
        names: list[str] = []
        asked: list[bool | torch.Tensor] = []
        for g, group in enumerate(optimizer.param_groups):
            moves: dict[torch.device, bool | torch.Tensor] = {}  # per device of the group's parameters
            for i, p in enumerate(group["params"]):
                grad = p.grad
                if grad is None:
                    continue
                why = _left_out(p, grad)
                if why is not None:
                    self._warn_left_out(p, why)
                    continue
                params.append(p)
                if p.device not in moves:
                    moves[p.device] = _asked_to_move(group, p.device)
                asked.append(moves[p.device])
                name = owner.module_of(p) if owner is not None else None
                names.append(name or f"param_groups[{g}].params[{i}]")
        with torch.no_grad():
            before = [_values(p).clone() for p in params]  # type: ignore[union-attr]
            grads = [_values(p.grad) for p in params]  # type: ignore[arg-type]
        self._snapshots[id(optimizer)] = _Snapshot(step, params, before, grads, names, asked)

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        snap = self._snapshots.pop(id(optimizer), None)
        if snap is None:
            return
        slot = self._slot(snap.step)
        slot.stepped.add(id(optimizer))
        self._measured = snap.step
        applied = _applied(optimizer)
        with torch.no_grad():
            for rows in _groups(snap, optimizer):
                self._measure(slot, snap, optimizer, rows, applied)
        snap.before.clear()  # the snapshot goes now
        if all(id(o) in slot.stepped for o in self.optimizers):
            slot.stats.complete = True
            self.last = slot.stats

    def _measure(
        self,
        slot: _Slot,
        snap: _Snapshot,
        optimizer: torch.optim.Optimizer,
        rows: list[int],
        applied: torch.Tensor | None,
    ) -> None:
        """One update_stats call over ``rows`` of the snapshot (one device, all with Adam state or none)."""
        params = [snap.params[i] for i in rows]
        after, shard_group, _ = local_shards([plain_values(p).detach() for p in params])  # type: ignore[union-attr]
        after = [plain_values(a) for a in after]  # an FSDP2 shard of a subclass: its plain values
        states = [_state(optimizer, p) for p in params]
        exp_avg_sq = [to_local(s) for s in states] if all(s is not None for s in states) else None
        kept = _keeps_small_updates(optimizer, params)
        stats = update_stats([snap.before[i] for i in rows], after, [snap.grads[i] for i in rows], exp_avg_sq)
        counts, sums, amax = stats.outputs()
        shards = combined_over(shard_group, self.group)
        if shards is not None:
            counts, sums, amax = self._across_ranks(counts, sums, amax, shards)
        device = counts.device
        flag = torch.ones((), dtype=torch.bool, device=device) if applied is None else applied.to(device)
        tensors = {"counts": counts, "sums": sums, "amax": amax, "applied": flag}
        asked = [snap.asked[i] for i in rows]
        if any(isinstance(a, torch.Tensor) for a in asked):  # a tensor learning rate on the device: read with the rest
            tensors["asked"] = torch.stack(
                [
                    a if isinstance(a, torch.Tensor) else torch.full((), a, dtype=torch.bool, device=device)
                    for a in asked
                ]
            )
        copy = HostCopy(tensors, device)
        dtypes = [
            (_dtype_name(p.dtype), None if s is None else _dtype_name(s.dtype))
            for p, s in zip(params, states, strict=True)
        ]
        host_asked = [a if isinstance(a, bool) else True for a in asked]  # the device flags: the copy's "asked"
        slot.stats.add(copy, [snap.names[i] for i in rows], dtypes, host_asked, kept)

    def _across_ranks(
        self, counts: torch.Tensor, sums: torch.Tensor, amax: torch.Tensor, shards: ShardGroups
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """FSDP2, tensor parallel: every rank's shards merged by the schema (counts and sums add, amax the
        maximum), each tensor once (ShardGroups): two all-reduces per mesh dimension sharded along, collective in
        the measured step (every rank steps the same optimizers)."""
        assert [o.merge for o in UPDATE_OUTPUTS] == [SUM, SUM, "max"], "the update outputs' merges changed"
        counts, sums, amax = shards.masked([counts.double(), sums, amax.clone()], [0.0, 0.0, -math.inf])
        summed = torch.cat([counts.flatten(), sums.flatten()])
        shards.all_reduce(summed, amax, self.timeout, "combining the update statistics", counts.device)
        c, s = summed.split([counts.numel(), sums.numel()])
        return c.round().to(torch.int64).reshape(counts.shape), s.reshape(sums.shape), amax

    # ---- what is not measured ----

    def _warn_left_out(self, param: torch.Tensor, why: str) -> None:
        """Once per watch and reason: a parameter the op cannot read (``_left_out`` says why) is not measured."""
        if why in self._warned:
            return
        self._warned.add(why)
        owner = self._owner()
        name = (owner.module_of(param) if owner is not None else None) or "a parameter"
        warnings.warn(
            f"amp_inspect: update_every leaves out {name} and every other parameter {why}: what the optimizer "
            "did is measured on dense float32, bfloat16 and float16 tensors only",
            RuntimeWarning,
            stacklevel=5,  # past _safely and the hook
        )

    def _safely(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, or None after ``_give_up`` when it raises: a measurement never stops the user's step."""
        try:
            return call(*args)
        except Exception as error:
            self._give_up(error)
            return None

    def _give_up(self, error: Exception) -> None:
        """A hook failed (out of memory for the snapshot, an optimizer state the op cannot read): update_every is
        turned off with a warning that says why, and training goes on. The open steps end without statistics."""
        for slot in self._slots.values():
            slot.stepped.clear()  # so that no half-measured step becomes ``last``
        self.close()
        warnings.warn(
            f"amp_inspect: update_every turned off: measuring optimizer.step() failed ({type(error).__name__}: "
            f"{error}); training goes on unmeasured",
            RuntimeWarning,
            stacklevel=5,  # past _safely and the hook
        )

    # ---- removal ----

    def close(self) -> None:
        """Removes the hooks for good (the Inspector's detach); a step still open is completed."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._snapshots.clear()
        for slot in self._slots.values():
            self._complete(slot)
        self._slots.clear()
        self.every = None


def _state(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> torch.Tensor | None:
    """Adam's second moment of ``param`` when the optimizer state holds one the op can read."""
    state = optimizer.state.get(param)
    value = state.get("exp_avg_sq") if isinstance(state, dict) else None
    if (
        isinstance(value, torch.Tensor)
        and value.dtype in INPUT_DTYPES
        and value.shape == param.shape
        and _values(value) is not None  # not torchao's 8-bit / 4-bit / fp8 state, which no plain tensor holds
    ):
        return _values(value)
    return None


def _left_out(param: torch.Tensor, grad: torch.Tensor) -> str | None:
    """Why the op cannot read ``param`` and its gradient (the words the warning ends with), or None when it can."""
    for t in (param, grad):  # torchao's quantized-training weights
        if _values(t) is None:
            return f"held in a tensor subclass whose values no plain tensor holds ({type(t).__name__})"
    if grad.layout != torch.strided:  # nn.Embedding(sparse=True), for SparseAdam
        return f"with a sparse gradient ({grad.layout})"
    if param.dtype not in INPUT_DTYPES:
        return f"of dtype {param.dtype}"
    return None


def _values(tensor: torch.Tensor) -> torch.Tensor | None:
    """What the op reads of a parameter, its gradient or its state: the plain tensor holding its values (a DTensor by
    its local shard; a tensor subclass by its plain values, model/subclasses.py), detached; None where no plain tensor
    holds them."""
    values = plain_values(tensor)
    return None if values is None else plain_values(to_local(values.detach()))


# How optimizers say that they keep the part of an update below half an ulp of a 16-bit weight, so that a weight
# left unchanged by one step lost nothing: torchao's ``bf16_stochastic_round`` (an attribute of its optimizers; the
# same name as a group option elsewhere) rounds stochastically, unbiased on average; a ``kahan_comp`` tensor in
# the parameter's state (optimi's ``kahan_sum``, and the optimizers that took its name) is a Kahan compensation
# buffer that carries the rounded-off part into the next step.
STOCHASTIC_ROUNDING_FLAGS = ("bf16_stochastic_round", "stochastic_rounding")
COMPENSATION_STATE = "kahan_comp"


def _keeps_small_updates(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> list[bool]:
    """Per parameter, whether ``optimizer`` keeps the sub-ulp part of its updates (stochastic rounding or compensated
    summation of a 16-bit weight); read after the step (the state exists then), from host values only."""
    flagged = any(getattr(optimizer, flag, None) is True for flag in STOCHASTIC_ROUNDING_FLAGS)
    in_flagged_group = {
        id(q)
        for g in optimizer.param_groups
        if any(g.get(flag) is True for flag in STOCHASTIC_ROUNDING_FLAGS)
        for q in g["params"]
    }
    out = []
    for p in params:
        state = optimizer.state.get(p)
        compensated = isinstance(state, dict) and isinstance(state.get(COMPENSATION_STATE), torch.Tensor)
        out.append(p.dtype in LOW_PRECISION and (flagged or id(p) in in_flagged_group or compensated))
    return out


def _asked_to_move(group: dict[str, Any], device: torch.device) -> bool | torch.Tensor:
    """Whether the step was asked to move a group's parameters on ``device``: False where its learning rate is 0 (a
    warm-up's first step, a group frozen by its rate). A number, or a tensor on the CPU while the parameters are
    elsewhere (torchao keeps it there), is read on the host; a tensor on the parameters' device (a compiled or
    capturable step's) is compared there and the flag read with the statistics (no sync); a tensor on another device
    is not read (True)."""
    lr = group.get("lr")
    if isinstance(lr, torch.Tensor) and lr.numel() == 1:
        if lr.device == device:
            return (lr.detach() != 0).reshape(())
        if lr.device.type == "cpu":
            return float(lr) != 0.0
        return True
    # Any real number type: a numpy scalar (np.float32(0.0), what schedulers built on numpy hand back) is a
    # learning rate of 0 too; what is not a real number (None, a string) says nothing.
    return not (isinstance(lr, numbers.Real) and float(lr) == 0.0)


def _groups(snap: _Snapshot, optimizer: torch.optim.Optimizer) -> Iterable[list[int]]:
    """The snapshot's rows by device and by whether the state holds exp_avg_sq: one op call each."""
    groups: dict[tuple[torch.device, bool], list[int]] = {}
    for i, p in enumerate(snap.params):
        groups.setdefault((snap.before[i].device, _state(optimizer, p) is not None), []).append(i)
    return groups.values()


def _applied(optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
    """For a fused optimizer stepped by GradScaler (which hands it ``found_inf``): whether the step applied, as a
    device flag (no sync); None where the step always applies."""
    found_inf = getattr(optimizer, "found_inf", None)
    return (found_inf == 0) if isinstance(found_inf, torch.Tensor) else None


DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}  # as the verdicts say them


def _dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))
