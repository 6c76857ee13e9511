"""Which module first produced a non-finite or overflowing activation, or output gradient.

After GradScaler skips a step, the gradients only say *that* something went wrong. An armed
:class:`ActivationWatcher` records, for every named submodule, the statistics of its forward output and of
the gradient that reaches that output in backward, in the order they ran. The first record that is
non-finite, or overflows the first of ``formats``, names the producer.

Terms:

- **forward output**: the floating-point tensors a module's ``forward`` returned (a tensor, or a nested
  tuple/list/dict of them), judged before any later in-place op changes them.
- **output gradient**: the gradient of the loss with respect to such a tensor, as autograd hands it to the
  op that produced it (a later in-place op does not change which gradient this is: it is the one for the
  value the module returned).
- **judged against a format**: a tensor is judged for overflow of ``formats[0]`` only where that format can hold
  it: a tensor of a low-precision dtype (fp16, bf16), or a float32 forward output made inside an autocast region
  (the next autocast op would cast it). A float32 output gradient is never judged for overflow: it is the loss's
  own gradient (the loss scale, 65536 by default, which fp16 cannot hold and never has to) or the gradient of an
  op autocast runs in float32; an fp16 gradient that overflowed is already Inf. Non-finite values are judged in
  every dtype.
- **execution order**: forward hooks run when a module's ``forward`` returns, so a child is recorded before
  the container that called it; output gradients are recorded in the order backward computes them. The
  two orders are kept apart: a forward problem is reported before any backward one.

Cost: nothing is registered while disarmed, so a disarmed watcher costs nothing. Armed, each module call
adds one ``tensor_stats`` pass over its output (a container re-reads its children's outputs), and each
output gradient one pass over that gradient; neither syncs the host. Reading findings syncs once.

Memory is bounded: once ``max_records`` records of one direction are held (many forwards while armed: evaluation
loops, long accumulation), they are folded (one host sync): only the first finding among them is kept, and once
a direction has a finding it records nothing more (only the first one is ever reported).

Copies and detached watchers: the hooks act only for the module object they were registered on and only while
their watcher is open (``close()``, the Inspector's ``detach()``, silences every one left anywhere). A deep copy
or a pickle of an armed model (an EMA, ``AveragedModel``, ``torch.save(model)``) gets hooks that do nothing in
their place, so it neither feeds the watcher nor keeps it alive.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from amp_inspect.core.formats import check_formats
from amp_inspect.core.printable import shown_name
from amp_inspect.core.tensor_stats import SUPPORTED_DTYPES, TensorStats, tensor_stats
from amp_inspect.model.naming import module_names
from amp_inspect.model.subclasses import plain_values

FORWARD_OUTPUT = "forward output"
OUTPUT_GRADIENT = "output gradient"
NONFINITE = "non-finite"
TO_INF = " to Inf"  # the end of the problem of a forward output that overflowed its own dtype (ActivationFinding)
MAX_RECORDS = 4096  # records held per direction before they are folded into their first finding (one sync)
LOW_PRECISION = (torch.float16, torch.bfloat16)  # dtypes judged for overflow of the format wherever they appear
DTYPE_WORDS = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", torch.float64: "fp64"}


@dataclass(frozen=True)
class ActivationFinding:
    """A module whose forward output or output gradient went non-finite or overflowed a format."""

    module: str
    direction: str  # FORWARD_OUTPUT or OUTPUT_GRADIENT
    # "non-finite"; f"overflowed {fmt}" (finite values beyond the judged format); or f"overflowed {dtype} to Inf":
    # the first forward output of the step that went non-finite held Inf and no NaN, so the module's own
    # arithmetic in that dtype overflowed (no output before it was non-finite: its inputs came finite).
    problem: str
    amax: float  # max |v| over the finite values of all the tensors in the record
    nonfinite: int  # NaN + Inf elements
    overflow: int  # finite elements that overflow the judged format
    step: int | None
    # An output gradient is computed by the backward of whatever consumed the output: the module whose output
    # gradient was recorded just before this one (finite: this is the first finding) ran that backward.
    made_by: str | None = None

    def __str__(self) -> str:
        if self.problem == NONFINITE:
            text = f"{shown_name(self.module)}: {self.direction} went non-finite ({self.nonfinite} NaN/Inf)"
        elif self.problem.endswith(TO_INF):
            text = f"{shown_name(self.module)}: {self.direction} {self.problem} ({self.nonfinite} Inf)"
        else:
            text = f"{shown_name(self.module)}: {self.direction} {self.problem}, amax {self.amax:.1e}"
        if self.made_by is not None:
            text += f" (made in the backward of {shown_name(self.made_by)})"
        return text if self.step is None else f"{text}, step {self.step}"


@dataclass(frozen=True)
class ActivationRecord:
    """The statistics of one module's forward output (all its float tensors, one row each) or of one output
    gradient (one row). ``seq`` counts from 0 within its direction, in execution order."""

    seq: int
    module: str
    direction: str
    stats: TensorStats
    step: int | None
    judged: tuple[bool, ...] = ()  # per row: whether overflow of the format counts (see "judged"); () = all rows
    dtypes: tuple[torch.dtype, ...] = ()  # per row: the tensor's dtype (() in records made before it was kept)


def _float_tensors(output: object) -> list[torch.Tensor]:
    """The dense float32/16/bf16/64 tensors in a nested tuple/list/dict, depth first, each once; a tensor subclass
    by the plain tensor holding its values, left out where none does (model/subclasses.py)."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [output]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            values = plain_values(item)
            if (
                values is not None
                and values.dtype in SUPPORTED_DTYPES
                and values.layout == torch.strided
                and values.device.type != "meta"
                and id(item) not in seen
            ):
                seen.add(id(item))
                found.append(values)
        elif isinstance(item, Mapping):
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, (tuple, list)):
            stack.extend(reversed(item))
    return found


class _InertHook:
    """What a watcher's forward hook becomes in a copy or a pickle of the model: a hook that does nothing."""

    def __call__(self, *args: object) -> None:
        return None


class _ForwardHook:
    """A watcher's forward hook on one module. It acts only for that module object and only while the watcher
    is open, holds both weakly, and copies or pickles as an ``_InertHook``: ``copy.deepcopy(model)`` (EMA,
    ``AveragedModel``) and ``torch.save(model)`` work while armed and take nothing of the watcher along."""

    __slots__ = ("_watcher", "_module", "name")

    def __init__(self, watcher: ActivationWatcher, module: nn.Module, name: str) -> None:
        self._watcher = weakref.ref(watcher)
        self._module = weakref.ref(module)
        self.name = name

    def __call__(self, called: nn.Module, args: object, output: object) -> None:
        watcher = self._watcher()
        if watcher is None or watcher._closed or called is not self._module():
            return None
        watcher._record_forward(self.name, output)
        return None

    def __reduce__(self) -> tuple[type[_InertHook], tuple[()]]:
        return (_InertHook, ())


class ActivationWatcher:
    """Records forward-output and output-gradient statistics of every named submodule while armed.

    Usage, after a skipped step::

        watcher = ActivationWatcher(model)
        with watcher.armed_for_step(step):
            loss = model(batch).loss
            scaler.scale(loss).backward()
        finding = watcher.first_finding()  # e.g. "blocks.3.mlp.fc2: forward output overflowed fp16, ..."

    The hooks never change an output or a gradient (they return None). Output gradients are watched with
    ``Tensor.register_hook`` on each output that requires grad, not with ``register_full_backward_hook``
    (which wraps outputs in a view and breaks a later in-place op on them). Those tensor hooks belong to the
    forward's graph and go away with it; ``new_step`` and ``disarm`` also remove any still pending.

    Args:
        model: the model (a DDP or torch.compile wrapper is fine).
        names: the modules to watch and the names to report; default :func:`module_names` of ``model``.
        formats: formats to count overflow etc. against; the first is the one findings judge.
    """

    max_records = MAX_RECORDS

    def __init__(
        self,
        model: nn.Module,
        *,
        names: Mapping[nn.Module, str] | None = None,
        formats: Sequence[str] = ("fp16",),
    ) -> None:
        self.model = model
        self.names: dict[nn.Module, str] = dict(module_names(model) if names is None else names)
        self.formats = check_formats(formats)
        self.step: int | None = None
        self._forward: list[ActivationRecord] = []
        self._backward: list[ActivationRecord] = []
        self._seq = {FORWARD_OUTPUT: 0, OUTPUT_GRADIENT: 0}  # records made this step, folded ones included
        self._folded: dict[str, ActivationFinding | None] = {}  # direction -> first finding among folded records
        self._module_handles: list[RemovableHandle] = []
        self._tensor_handles: list[RemovableHandle] = []
        # Bumped by new_step and disarm: a tensor hook from an older forward then records nothing.
        self._epoch = 0
        self._closed = False

    # -- arming -----------------------------------------------------------------------------------------

    @property
    def armed(self) -> bool:
        return bool(self._module_handles)

    @property
    def closed(self) -> bool:
        return self._closed

    def arm(self) -> None:
        """Registers one forward hook per watched module (no-op when already armed, or closed). Costs Python
        work per module, no device work."""
        if self.armed or self._closed:
            return
        for module, name in self.names.items():
            self._module_handles.append(module.register_forward_hook(self._forward_hook(module, name)))

    def close(self) -> None:
        """Disarms for good: ``arm`` does nothing from now on, and hooks left on copies of the model record
        nothing. Records are kept."""
        self._closed = True
        self.disarm()

    def close_when_dropped(self, owner: object) -> None:
        """Closes this watcher (its hooks leave the model) once ``owner`` is garbage-collected: an Inspector
        dropped without ``detach()`` leaves no hooks behind. The hooks reference this watcher, never the owner,
        so they do not keep it alive."""
        weakref.finalize(owner, self.close).atexit = False  # at exit the model goes too: nothing to remove

    def disarm(self) -> None:
        """Removes every forward hook and every output-gradient hook not yet run; records are kept."""
        for handle in self._module_handles:
            handle.remove()
        self._module_handles.clear()
        self._drop_tensor_hooks()

    def new_step(self, step: int) -> None:
        """Forgets the records (and pending output-gradient hooks) of the previous step. No device work."""
        self.step = step
        self._forward = []
        self._backward = []
        self._seq = {FORWARD_OUTPUT: 0, OUTPUT_GRADIENT: 0}
        self._folded = {}
        self._drop_tensor_hooks()

    @contextlib.contextmanager
    def armed_for_step(self, step: int) -> Iterator[ActivationWatcher]:
        """``new_step(step)`` and armed inside the block; disarmed after it unless it was armed before.
        Run backward inside the block: once disarmed, output-gradient hooks record nothing."""
        was_armed = self.armed
        self.new_step(step)
        self.arm()
        try:
            yield self
        finally:
            if not was_armed:
                self.disarm()

    def _drop_tensor_hooks(self) -> None:
        self._epoch += 1
        for handle in self._tensor_handles:
            handle.remove()
        self._tensor_handles.clear()

    # -- hooks ------------------------------------------------------------------------------------------

    def _forward_hook(self, module: nn.Module, name: str) -> _ForwardHook:
        return _ForwardHook(self, module, name)

    def _record_forward(self, name: str, output: object) -> None:
        tensors = _float_tensors(output)
        if not tensors or self._folded.get(FORWARD_OUTPUT) is not None:
            return  # nothing to judge, or the first forward finding of this step is known already
        with torch.no_grad():
            stats = tensor_stats([t.detach() for t in tensors], formats=self.formats)
        judged = tuple(t.dtype in LOW_PRECISION or _autocast_casts(t) for t in tensors)
        dtypes = tuple(t.dtype for t in tensors)
        record = ActivationRecord(
            self._next_seq(FORWARD_OUTPUT), name, FORWARD_OUTPUT, stats, self.step, judged, dtypes
        )
        self._add(self._forward, record)
        epoch = self._epoch
        for t in tensors:
            # A leaf (a parameter returned as is) would keep the hook across steps; its .grad is the
            # gradient statistics' business, not this watcher's.
            if t.requires_grad and t.grad_fn is not None:
                self._tensor_handles.append(t.register_hook(self._gradient_hook(name, epoch)))

    def _gradient_hook(self, name: str, epoch: int):
        watcher_ref = weakref.ref(self)

        def hook(grad: torch.Tensor) -> None:
            watcher = watcher_ref()
            if watcher is None or watcher._closed or epoch != watcher._epoch:
                return None
            watcher._record_gradient(name, grad)
            return None

        return hook

    def _record_gradient(self, name: str, grad: torch.Tensor) -> None:
        if grad.dtype not in SUPPORTED_DTYPES or grad.layout != torch.strided:
            return
        if self._folded.get(OUTPUT_GRADIENT) is not None:
            return  # the first output-gradient finding of this step is known already
        with torch.no_grad():
            stats = tensor_stats([grad.detach()], formats=self.formats)
        judged = (grad.dtype in LOW_PRECISION,)
        record = ActivationRecord(self._next_seq(OUTPUT_GRADIENT), name, OUTPUT_GRADIENT, stats, self.step, judged)
        self._add(self._backward, record)

    def _next_seq(self, direction: str) -> int:
        seq = self._seq[direction]
        self._seq[direction] = seq + 1
        return seq

    def _add(self, records: list[ActivationRecord], record: ActivationRecord) -> None:
        """Appends; at ``max_records`` folds the list into its first finding (reads the statistics: one sync)."""
        records.append(record)
        if len(records) < self.max_records:
            return
        found = self._findings_of(records)
        if self._folded.get(record.direction) is None:
            self._folded[record.direction] = found[0] if found else None
        records.clear()

    # -- reading ----------------------------------------------------------------------------------------

    @property
    def records(self) -> list[ActivationRecord]:
        """This step's records not yet folded (see ``max_records``): forward outputs in execution order, then
        output gradients in backward order. Their statistics stay on the device (no sync)."""
        return self._forward + self._backward

    def findings(self) -> list[ActivationFinding]:
        """Every record whose values are non-finite or overflow ``formats[0]``, forward ones first, each
        direction in execution order; of records already folded, only the first finding. Reads the statistics
        to the host: on CUDA this syncs once."""
        found = []
        for direction, records in ((FORWARD_OUTPUT, self._forward), (OUTPUT_GRADIENT, self._backward)):
            first = self._folded.get(direction)
            found += ([first] if first is not None else []) + self._findings_of(records)
        return found

    def _findings_of(self, records: Sequence[ActivationRecord]) -> list[ActivationFinding]:
        summaries = _summarize(records)
        found = []
        for i, (record, (nonfinite, overflow, amax, inf_dtype)) in enumerate(zip(records, summaries, strict=True)):
            if nonfinite == 0 and overflow == 0:
                continue
            problem = NONFINITE if nonfinite else f"overflowed {record.stats.formats[0]}"
            if (
                inf_dtype is not None
                and record.direction == FORWARD_OUTPUT
                and not found
                and not self._folded.get(FORWARD_OUTPUT)
            ):
                # The step's first forward output to go non-finite, with Inf and no NaN: the module's own
                # arithmetic overflowed its output dtype (inputs non-finite would have shown in an output before).
                problem = f"overflowed {inf_dtype}{TO_INF}"
            made_by = None
            if record.direction == OUTPUT_GRADIENT and not found and i > 0:
                made_by = _maker(record.module, records[:i])
            found.append(
                ActivationFinding(
                    record.module, record.direction, problem, amax, nonfinite, overflow, record.step, made_by
                )
            )
        return found

    def first_finding(self) -> ActivationFinding | None:
        """The first forward output in execution order that is non-finite or overflows ``formats[0]``; if
        there is none, the first such output gradient in backward order; None when all are clean. Reads the
        statistics to the host: on CUDA this syncs once."""
        found = self.findings()
        return found[0] if found else None


def _summarize(records: Sequence[ActivationRecord]) -> list[tuple[int, int, float, str | None]]:
    """(nonfinite, overflow of the record's first format, amax, inf_dtype) per record, with one device-to-host copy
    per device (a record keeps the formats it was made with: an Inspector's formats may follow the autocast dtype
    later). ``inf_dtype``: when the record holds Inf and no NaN, the words for the narrowest dtype among its
    tensors with Inf ("fp16"); else None."""
    if not records:
        return []
    by_device: dict[torch.device, list[int]] = {}
    for i, record in enumerate(records):
        by_device.setdefault(record.stats.numel.device, []).append(i)
    rows: list[list[list[float]]] = [[] for _ in records]
    for indices in by_device.values():
        group = [records[i].stats for i in indices]
        # float64 holds counts exactly up to 2**53 elements.
        table = torch.stack(
            [
                torch.cat([s.nonfinite for s in group]).double(),
                torch.cat([s.overflow[:, 0] for s in group]).double(),
                torch.cat([s.amax for s in group]).double(),
                torch.cat([s.nan for s in group]).double(),
            ],
            dim=1,
        ).tolist()
        start = 0
        for i, s in zip(indices, group, strict=True):
            rows[i] = table[start : start + len(s)]
            start += len(s)
    out = []
    for record, rs in zip(records, rows, strict=True):
        judged = record.judged or (True,) * len(rs)
        overflow = sum(r[1] for r, j in zip(rs, judged, strict=True) if j)
        nonfinite, nan = int(sum(r[0] for r in rs)), int(sum(r[3] for r in rs))
        inf_dtype = None
        if nonfinite > 0 and nan == 0 and len(record.dtypes) == len(rs):
            with_inf = [d for r, d in zip(rs, record.dtypes, strict=True) if r[0] > 0]
            narrowest = min(with_inf, key=lambda d: torch.finfo(d).max)
            inf_dtype = DTYPE_WORDS.get(narrowest, str(narrowest))
        out.append((nonfinite, int(overflow), max((r[2] for r in rs), default=0.0), inf_dtype))
    return out


def _maker(module: str, before: Sequence[ActivationRecord]) -> str | None:
    """The module whose backward made ``module``'s output gradient: the last output gradient recorded before it (all
    of them finite) that is not ``module`` itself or a module containing it (a container's output gradient arrives
    before its children's, and says nothing about who computed theirs)."""
    for record in reversed(before):
        if record.module != module and not module.startswith(record.module + "."):
            return record.module
    return None


def _autocast_casts(t: torch.Tensor) -> bool:
    """Whether ``t`` (a forward output) sits in an autocast region that casts to a low-precision dtype: the next
    autocast op would cast it, so the format's range applies to it."""
    if t.dtype not in (torch.float32, torch.float64):
        return False
    try:
        return torch.is_autocast_enabled(t.device.type) and torch.get_autocast_dtype(t.device.type) in LOW_PRECISION
    except (TypeError, RuntimeError):
        return False
