"""One pass over a step's gradients, the same for ``Inspector.check()`` and both InspectingGradScaler hooks:
collect the gradients, run the op per device, combine the shards across ranks, build the StepReport.

Which values stand for a gradient, decided here once for every caller:

- **dense**: the gradient itself; a DTensor (FSDP2) by this rank's shard, its statistics combined with the
  other ranks' shards into whole-parameter ones.
- **sparse COO** (``nn.Embedding(sparse=True)``): the statistics judge the values of the coalesced gradient (a
  repeated index is one gradient row, as the optimizer and torch's clip_grad_norm_ see it), so numel counts
  stored values; an uncoalesced gradient's are a copy. Unscaling and clipping write its stored values in
  place (coalescing commutes with scaling), as GradScaler does; the scaler coalesces an fp16 one first, as
  GradScaler does.
- **complex**: its real and imaginary parts (``torch.view_as_real``: the norm is exact, numel counts both
  parts), everywhere: check() inspects them, InspectingGradScaler unscales them (a complex number times a real
  inverse scale is its parts times it; torch's GradScaler has no complex kernel and raises), and
  ``Inspector.clip_grad_norm_`` clips them.
- other layouts (sparse CSR, ...): refused with the parameter's name, never silently left out.
- a **tensor subclass** (torchao's quantized training; model/subclasses.py): the plain tensor that holds its values
  exactly, where one does; otherwise check() leaves it out, with one warning per inspector naming the parameter and
  the subclass (its module's row holds its other parameters), and an InspectingGradScaler, which must unscale
  every gradient, refuses it naming both. A quantized weight's gradient is usually a plain tensor: measured.

Cost: one fused op call per device (``tensor_stats`` / ``unscale_stats_``), an index copy for the rows of
uncoalesced sparse gradients, and, for sharded gradients, two all-reduces (distributed/combine.py). No host sync on
CUDA, except that a list spread over devices gathers its rows onto the first one (stats.merge_rows).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from amp_inspect.core.ops import unscale_stats_op
from amp_inspect.core.printable import shown_name
from amp_inspect.core.tensor_stats import SUPPORTED_DTYPES, TensorStats, merge_rows, stats_outputs, tensor_stats
from amp_inspect.core.torch_compat import loss_scale_tensor, sparse_stored_values
from amp_inspect.distributed.combine import Combiner, Combiners, GlobalStats, ShardGroups, local_shards
from amp_inspect.distributed.rank_record import SideBySide
from amp_inspect.gradients.step_report import SHARDS, StepReport
from amp_inspect.model.subclasses import plain_values, subclass_name

LAYOUTS = (torch.strided, torch.sparse_coo)


def judged_values(grad: torch.Tensor) -> torch.Tensor:
    """The strided real tensor whose values stand for ``grad`` in the statistics (see the module docstring).
    Read-only: an uncoalesced sparse gradient's values are a copy."""
    if grad.layout == torch.sparse_coo:
        grad = grad.coalesce().values()  # coalesce() of a coalesced tensor is itself: a view, no copy
    return torch.view_as_real(grad) if grad.is_complex() else grad


@dataclass
class Gradients:
    """A step's gradients, collected once, in the order the report lists them.

    ``written`` are this rank's pieces as views (writing them writes the gradients: the unscale); ``judged``
    the values the statistics read, the same tensors except where a sparse gradient's coalesced values are a
    copy. ``whole`` keeps DTensors whole (their shapes are the parameters': the layout check across ranks)."""

    params: list[torch.Tensor] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    whole: list[torch.Tensor] = field(default_factory=list)
    written: list[torch.Tensor] = field(default_factory=list)
    judged: list[torch.Tensor] = field(default_factory=list)
    sparse_modules: list[str] = field(default_factory=list)
    shard_group: ShardGroups | None = None  # where the other shards are (None: not sharded)
    partial: str | None = None  # why the statistics cover this rank's pieces only (None: they are whole)
    # (parameter name, subclass name) of gradients no plain tensor holds the values of: not measured
    not_measured: list[tuple[str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.written)

    @property
    def copied_rows(self) -> list[int]:
        """Rows whose judged values are a copy (uncoalesced sparse gradients): the unscale pass measures the
        stored values it writes, and these rows take the statistics of the copy instead."""
        return [i for i, (w, j) in enumerate(zip(self.written, self.judged, strict=True)) if w is not j]


def _add(grads: Gradients, param: torch.Tensor, grad: torch.Tensor, module: str) -> None:
    if grad.layout == torch.sparse_coo:
        written = sparse_stored_values(grad)
        judged = written if grad.is_coalesced() else grad.coalesce().values()
        grads.sparse_modules.append(module)
    else:
        written = judged = grad
    if grad.is_complex():
        same = judged is written
        written = torch.view_as_real(written)
        judged = written if same else torch.view_as_real(judged)
    grads.params.append(param)
    grads.modules.append(module)
    grads.whole.append(written)
    grads.judged.append(judged)


def _localize(grads: Gradients) -> Gradients:
    """DTensor gradients replaced by this rank's shards (views), and the group holding the other shards."""
    local, grads.shard_group, grads.partial = local_shards(grads.whole)
    # A copied (sparse) row is never a DTensor: it keeps its copy; every other row judges what it writes.
    grads.judged = [j if j is not w else loc for w, j, loc in zip(grads.whole, grads.judged, local, strict=True)]
    grads.written = local
    return grads


def _refused(owner: str, name: str, grad: torch.Tensor) -> str | None:
    if grad.layout not in LAYOUTS:
        return (
            f"{owner}: the gradient of {name} has layout {grad.layout}; only dense and sparse COO gradients can be "
            "inspected"
        )
    return None


def of_parameters(params: Iterable[tuple[str, str, torch.Tensor]]) -> Gradients:
    """The gradients of ``(parameter name, module name, parameter)`` triples that have one, read-only (the
    Inspector's check()). TypeError naming the parameter for a layout, dtype or device that cannot be inspected."""
    grads = Gradients()
    for name, module, param in params:
        grad = param.grad
        if grad is None:
            continue
        values = plain_values(grad)
        if values is None:
            grads.not_measured.append((name, subclass_name(grad)))
            continue
        grad = values
        if why := _refused("amp_inspect", f"parameter {name!r}", grad):
            raise TypeError(why)
        _add(grads, param, grad, module)
        judged = grads.judged[-1]
        # Named here: tensor_stats would only say "tensor i".
        if judged.dtype not in SUPPORTED_DTYPES or judged.device.type == "meta":
            what = "is on the meta device (no values)" if judged.device.type == "meta" else f"is {judged.dtype}"
            raise TypeError(
                f"amp_inspect: the gradient of parameter {name!r} {what}; amp_inspect inspects float32, float16, "
                "bfloat16 and float64 gradients (complex ones as their real and imaginary parts)"
            )
    return _localize(grads)


def of_optimizer(
    optimizer: torch.optim.Optimizer, module_of: Callable[[torch.Tensor], str | None], allow_fp16: bool
) -> Gradients:
    """The gradients of ``optimizer``'s parameters in its order (the InspectingGradScaler's unscale), named by
    ``module_of`` or by their place in the optimizer. GradScaler's rules: ValueError for fp16 gradients unless
    ``allow_fp16``; a sparse fp16 gradient replaced by its coalesced self first (``param.grad`` is set)."""
    grads = Gradients()
    for g_index, group in enumerate(optimizer.param_groups):
        for p_index, param in enumerate(group["params"]):
            grad = param.grad
            if grad is None:
                continue
            if not allow_fp16 and grad.dtype == torch.float16:
                raise ValueError("Attempting to unscale FP16 gradients.")
            name = module_of(param) or f"param_groups[{g_index}].params[{p_index}]"
            values = plain_values(grad)
            if values is None:  # left out, it would stay scaled: the step would apply it times the scale
                raise TypeError(
                    f"InspectingGradScaler: the gradient of {name} is a {subclass_name(grad)}, a tensor subclass "
                    "whose values no plain tensor holds, so it cannot be unscaled in place"
                )
            wrapped, grad = values is not grad, values  # a subclass's plain values: unscaling them unscales it
            if why := _refused("InspectingGradScaler", name, grad):
                raise TypeError(why)
            if grad.layout == torch.sparse_coo and grad.dtype is torch.float16 and not wrapped:
                param.grad = grad = grad.coalesce()
            _add(grads, param, grad, name)
    return _localize(grads)


# ---- the op per device ----


def measure(
    grads: Gradients,
    formats: Sequence[str],
    scale: torch.Tensor | None = None,
    unscaled: Sequence[bool] | None = None,
) -> TensorStats:
    """Statistics of the judged values, read-only. ``unscaled[i]``: gradient i was unscaled already (a plain
    GradScaler's unscale_ ran for its optimizer), so it is judged multiplied back by ``scale``, as fp16 saw it;
    the others as stored. A scale on the host that is not finite and positive cannot be judged at: all as stored
    (the report says why)."""
    flags = list(unscaled) if unscaled is not None and scale is not None else [False] * len(grads)
    if any(flags) and scale is not None and scale.device.type == "cpu":
        value = float(scale)  # on the host: no sync
        if not (math.isfinite(value) and value > 0):
            flags = [False] * len(grads)
    formats = tuple(formats)
    if all(flags) or not any(flags):
        return tensor_stats(grads.judged, scale=scale if flags and flags[0] else None, formats=formats)
    # Some optimizers' gradients are unscaled already, others not: judge each group in its own picture and put
    # the rows back in order.
    groups = [[i for i, u in enumerate(flags) if u is flag] for flag in (True, False)]
    parts = [
        (rows, stats_outputs(tensor_stats([grads.judged[i] for i in rows], scale=judge, formats=formats)))
        for rows, judge in zip(groups, (scale, None), strict=True)
    ]
    return TensorStats.from_op_outputs(merge_rows(parts, len(grads), grads.judged[0].device), formats)


def unscale(
    grads: Gradients, inv_scale: torch.Tensor, found_inf: torch.Tensor, formats: Sequence[str]
) -> tuple[TensorStats | None, dict[torch.device, torch.Tensor]]:
    """Statistics of the gradients as stored (scaled), and the gradients multiplied by ``inv_scale`` in place,
    in one pass per device; found_inf per device set to 1 on NaN/Inf, as GradScaler's unscale does. Returns
    (statistics, or None without gradients; found_inf per device)."""
    found: dict[torch.device, torch.Tensor] = {}
    by_device: dict[torch.device, list[int]] = {}
    for i, g in enumerate(grads.written):
        by_device.setdefault(g.device, []).append(i)
    parts = []
    with torch.no_grad():
        for device, rows in by_device.items():
            flag = found.setdefault(device, found_inf.to(device, copy=True))
            outputs = unscale_stats_op([grads.written[i] for i in rows], inv_scale.to(device), flag, list(formats))
            parts.append((rows, outputs))
    if not parts:
        return None, found
    merged = merge_rows(parts, len(grads), parts[0][1][0].device)
    copied = grads.copied_rows
    if copied:  # the copies were made before the unscale: judged as stored, like the others
        merged = tuple(t.clone() for t in merged)  # not the op's own outputs: written below
        fixed = stats_outputs(tensor_stats([grads.judged[r] for r in copied], formats=tuple(formats)))
        index = torch.tensor(copied, dtype=torch.int64, device=merged[0].device)
        for out, new in zip(merged, fixed, strict=True):
            out.index_copy_(0, index, new.to(out.device))
    return TensorStats.from_op_outputs(merged, tuple(formats)), found


# ---- across ranks, and the report ----


@dataclass
class Measured:
    """One pass's statistics (one optimizer's gradients, or the model's), whole across ranks where sharded."""

    stats: TensorStats
    modules: list[str]
    sparse_modules: list[str]
    origin: GlobalStats | None = None  # the combined statistics, with the per-rank NaN/Inf record of the shards


def combined(grads: Gradients, stats: TensorStats, combiner: Combiner | None) -> Measured:
    """``stats`` of this rank's pieces made whole-parameter statistics with every rank's (collective: every rank
    of the combiner's group takes part), or as they are without a combiner."""
    if combiner is None:
        return Measured(stats, list(grads.modules), list(grads.sparse_modules))
    merged = combiner.combine(stats, [tuple(g.shape) for g in grads.whole])
    return Measured(merged.stats, list(grads.modules), list(grads.sparse_modules), merged)


def step_report(
    step: int, passes: Sequence[Measured], scale: torch.Tensor | None, *, skips: bool | None = None
) -> StepReport:
    """The StepReport of one step from its passes (several optimizers on one scaler: one each, rows in order),
    with the per-rank NaN/Inf counts of the shards when every pass combined them over the same ranks. Copies
    of passes on other devices to the first one's are asynchronous."""
    if len(passes) == 1:
        stats = passes[0].stats
    else:
        home = passes[0].stats.numel.device
        outputs = [stats_outputs(p.stats) for p in passes]
        stats = TensorStats.from_op_outputs(
            tuple(
                torch.cat([out[k].to(home, non_blocking=home.type != "cpu") for out in outputs])
                for k in range(len(outputs[0]))
            ),
            passes[0].stats.formats,
        )
    modules = [m for p in passes for m in p.modules]
    sparse = [m for p in passes for m in p.sparse_modules]
    report = StepReport(step, stats, modules, scale, skips=skips, sparse_modules=sparse)
    origins = [p.origin for p in passes]
    first = origins[0]
    if first is not None and all(o is not None and o.ranks == first.ranks for o in origins):
        records = [o.record for o in origins if o is not None]
        counts = records[0] if len(records) == 1 else SideBySide(records)
        report.set_rank_origin(counts, modules, first.ranks, kind=SHARDS)
    return report


def clip_(params: Iterable[nn.Parameter], max_norm: float, total_norm: torch.Tensor) -> None:
    """Scales the gradients of ``params`` by min(1, max_norm / (total_norm + 1e-6)) in place, as
    torch.nn.utils.clip_grad_norm_ does once it has the norm (torch's own clip_grads_with_norm_: DTensors by
    their shards, sparse gradients by their stored values, complex ones by both parts; no host sync)."""
    torch.nn.utils.clip_grads_with_norm_(list(params), max_norm, total_norm)


def clip_by_report(
    params: Iterable[nn.Parameter], max_norm: float, norm_type: float, report: StepReport | None, step: int
) -> torch.Tensor:
    """``Inspector.clip_grad_norm_``: clips with the total norm of ``report``, which must be the report of
    ``step`` (the step check() inspected last). Returns that norm."""
    if norm_type != 2.0:
        raise ValueError("clip_grad_norm_ uses the L2 norm of the inspection; norm_type must be 2")
    if report is None or report.step != step:
        raise RuntimeError("call check() on this step before clip_grad_norm_ (every= may have skipped it)")
    total = report.total_norm_tensor
    clip_(params, max_norm, total)
    return total


SHOWN_NAMES = 10  # parameters a warning names before "..."


def not_measured_warning(left_out: Sequence[tuple[str, str]]) -> str:
    """The one warning of gradients left out: each parameter with its subclass."""
    named = ", ".join(f"{shown_name(name)} ({kind})" for name, kind in left_out[:SHOWN_NAMES])
    more = f" and {len(left_out) - SHOWN_NAMES} more" if len(left_out) > SHOWN_NAMES else ""
    which = f"gradients of {named}{more} are" if len(left_out) > 1 else f"gradient of {named} is"
    return (
        f"amp_inspect: the {which} not measured: a tensor subclass whose values no plain tensor holds (its own "
        "dequantization makes them); check() reports the other gradients"
    )


UnscaledOf = Callable[[torch.amp.GradScaler, Sequence[torch.Tensor]], list[bool]]


class ParameterPass:
    """``Inspector.check()``'s pass over a model's parameters, step after step: the combiners across ranks it
    keeps (FSDP2), and a pass that leaves parameters out (``Gradients.partial``) warned about once."""

    def __init__(self) -> None:
        self._combiners = Combiners()
        self._warned_partial = False
        self._warned_not_measured: set[str] = set()  # parameters said once each

    def run(
        self,
        step: int,
        params: Iterable[tuple[str, str, torch.Tensor]],
        formats: Sequence[str],
        scaler: torch.amp.GradScaler | None,
        unscaled_of: UnscaledOf,
        group: dist.ProcessGroup | None,
        timeout: float,
    ) -> StepReport:
        """The report of ``step``: judged at ``scaler``'s scale (its own tensor) where it is enabled, gradients
        that ``unscaled_of`` says its unscale_ already ran on multiplied back by it. Collective where the
        gradients are sharded: every rank's check() takes part."""
        grads = of_parameters(params)
        if grads.partial and not self._warned_partial:
            self._warned_partial = True
            warnings.warn(f"amp_inspect: {grads.partial}", RuntimeWarning, stacklevel=5)  # the caller of check()
        new = [(name, kind) for name, kind in grads.not_measured if name not in self._warned_not_measured]
        if new:
            self._warned_not_measured.update(name for name, _ in new)
            warnings.warn(not_measured_warning(new), RuntimeWarning, stacklevel=5)
        skips = scaler is not None and scaler.is_enabled()
        scale = loss_scale_tensor(scaler) if skips else None
        unscaled = unscaled_of(scaler, grads.params) if scaler is not None and scale is not None else None
        stats = measure(grads, formats, scale, unscaled)
        measured = combined(grads, stats, self._combiners.over(grads.shard_group, group, timeout))
        return step_report(step, [measured], scale, skips=skips)
