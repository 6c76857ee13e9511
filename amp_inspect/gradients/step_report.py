"""StepReport: what one inspected step found, per module, and what it means for the loss scale.

Terms (the format terms overflow, subnormal, underflow are defined in amp_inspect/core/formats.py; counts are for
the first of the inspector's formats unless a key names another, e.g. "overflow/bf16"):

- The **judged picture** is the gradients as fp16 saw them in the backward pass: scaled by the loss scale.
  Before ``scaler.unscale_`` the stored gradients are that picture; after it they are multiplied back by the
  current scale first. Without a scaler, the gradients as stored.
- **found_inf**: some gradient holds NaN or Inf, the condition under which GradScaler skips the step.
- **skipped** / **poisoned**: a found_inf step with an enabled GradScaler is skipped (the optimizer does not
  step); without one (no scaler, a disabled one: bf16 runs usually have none) nothing skips it, and the
  optimizer applies the non-finite gradients: the step is **poisoned**.
- **sparse gradients** (``nn.Embedding(sparse=True)``): the stored values of the coalesced gradient are judged
  (a repeated index is one row, as the optimizer sees it), so numel counts those stored values, not the
  parameter's elements; ``sparse_modules`` names them.
- **offenders**: modules with any NaN/Inf gradient, most non-finite values first.
- **nonfinite_origin**: of the offenders, the one whose gradients autograd computed first (closest to the
  output: ``backward_order``, recorded by the Inspector on the first backward); the others may have received
  its NaN/Inf (amp_inspect/evidence/attribution.py says how blame is decided).
- **amax**, **grad_norm**, **total_norm**: unscaled (divided by the loss scale), as the optimizer sees them.
  total_norm is NaN when any gradient is NaN, else Inf when any is Inf, like torch's clip_grad_norm_. A module's
  amax is over its finite values, and **unknown** (NaN) when it has none; its grad_norm is unknown (NaN) when any of
  its values is NaN/Inf: a norm of the finite rest, or 0 for a module that is all NaN, would read as a measurement.
- **headroom** and ``recommended_scale``: defined in amp_inspect/evidence/headroom.py.

Building a report never syncs the host: it holds device tensors (copied to pinned host memory
asynchronously on CUDA) and reads them on the first use of a host value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import torch

from amp_inspect.core.host_copy import HostCopy
from amp_inspect.core.printable import shown_name
from amp_inspect.core.statistics import PER_BIN, PER_FORMAT, STATISTICS, Derived, derive, module_record_fields
from amp_inspect.core.table import fixed_width
from amp_inspect.core.tensor_stats import TensorStats
from amp_inspect.evidence.attribution import (
    BEFORE_ALLREDUCE,
    ORIGIN_HEADINGS,
    SHARDS,
    every_module,
    finding_module,
    modules_in_trouble,
    origin_in_order,
    step_origin,
)
from amp_inspect.evidence.headroom import Headroom, balanced_scale, measure_headroom
from amp_inspect.evidence.weights import WeightsSeen

# Headroom and the origin kinds are defined in torch-free modules (the log readers use them); they stay
# importable from here, where StepReport's users have always found them.
__all__ = ["BEFORE_ALLREDUCE", "ORIGIN_HEADINGS", "SHARDS", "Headroom", "StepReport", "modules_in_trouble"]

MAX_TABLE_ROWS = 12


def known(value: float) -> str:
    """A measured value for a table: "unknown" for NaN (nothing finite to measure)."""
    return "unknown" if math.isnan(value) else f"{value:.3g}"


class StatsSnapshot(HostCopy):
    """TensorStats (and the loss scale) on their way to the host, as HostCopy."""

    def __init__(self, stats: TensorStats, scale: torch.Tensor | None) -> None:
        self.formats = stats.formats
        device = stats.numel.device
        tensors = stats.as_dict()
        if scale is not None:
            # The caller's own copy of the loss scale (StepReport makes it: GradScaler.update() changes the
            # scaler's in place), on the statistics' device so one copy path serves both (a CUDA scale with
            # CPU statistics waits here for it).
            tensors["scale"] = scale.reshape(()).to(device, torch.float32)
        super().__init__(tensors, device)


class ReportPart(Protocol):
    """What a probe's measurement that rides on a report offers it (readiness/report.py's ReadinessReport,
    updates/report.py's UpdateStats, scaling/policies.py's ScaleDecision): its log entry, and whether its device
    values are on the host."""

    def to_record(self) -> dict[str, Any]: ...

    def ready(self) -> bool: ...


class WeightsPart(ReportPart, Protocol):
    """What the report reads of the weight watch's read of the parameters (probes/weight_watch.py)."""

    @property
    def seen(self) -> WeightsSeen: ...


class RankCounts(Protocol):
    """The NaN/Inf count of each rank (row) and tensor (column), as the report reads it without the whole table:
    the DDP hook's record (distributed/rank_record.py), or a [world, K] table (``_CountTable``)."""

    shape: tuple[int, ...]  # (world, K)

    def ready(self) -> bool:
        """Whether ``nonzero()`` can be read without waiting for the device or the other ranks."""
        ...

    def nonzero(self) -> tuple[list[tuple[int, int, int]], bool]:
        """((row, column, count) of every nonzero count, by row then column; whether that is final: a record
        may learn more on a later step). Waits for the device on first use."""
        ...


class _CountTable:
    """A [world, K] count table (FSDP2's shards) on its way to the host, read as RankCounts."""

    def __init__(self, counts: torch.Tensor) -> None:
        self.shape = tuple(counts.shape)
        self._copy = HostCopy({"counts": counts}, counts.device)

    def ready(self) -> bool:
        return self._copy.ready()

    def nonzero(self) -> tuple[list[tuple[int, int, int]], bool]:
        counts = self._copy.host()["counts"]
        return [(int(r), int(c), int(counts[r, c])) for r, c in zip(*np.nonzero(counts), strict=True)], True


class UpdatePart(ReportPart, Protocol):
    """What the report reads of the optimizer step's UpdateStats (updates/report.py)."""

    complete: bool
    by_module: Mapping[str, Any]
    skipped: bool


# The fields a report learns after it is made, each from one probe or link, all set by ``StepReport.annotate``
# in the inspector's one annotate pass (inspection/inspector.py): the probe returns its part, the report takes it.
ANNOTATIONS = frozenset(
    {
        "first_nonfinite",  # probes/_activation_arming.py: the first module whose output went non-finite
        "backward_order",  # gradients/step_context.py: modules in the order autograd made their gradients
        "autocast",  # gradients/step_context.py: the autocast format the forward ran under
        "rank_origin",  # distributed/ddp.py: each rank's NaN/Inf counts from before the all-reduce
        "hardware",  # inspection/_log_sink.py: memory etc. when the step was inspected
        "recent_recommended",  # inspection/_step_history.py: recommended scales of recent finalized steps
        "readiness",  # readiness/hooks.py: the step's ReadinessReport
        "update",  # updates/watch.py: what the step's optimizer.step() did
        "scale_decision",  # scaling/scaler.py: the headroom policy's decision after the step
        "weights",  # probes/weight_watch.py: whether the weights were NaN/Inf, read after NaN/Inf gradients
        "clip_norm",  # inspection/inspector.py: the norm the loop clips the gradients to (Inspector.clip_norm)
    }
)


class StepReport:
    """The inspection of one step: see the module docstring for the terms.

    ``module_of_row`` names the module of each row of the statistics (one row per gradient tensor);
    ``scale`` is the loss scale as a 0-dim device tensor (None without a scaler).
    """

    def __init__(
        self,
        step: int,
        stats: TensorStats,
        module_of_row: Sequence[str],
        scale: torch.Tensor | None,
        *,
        skips: bool | None = None,
        sparse_modules: Sequence[str] = (),
    ) -> None:
        if len(module_of_row) != len(stats):
            raise ValueError(f"{len(module_of_row)} module names for {len(stats)} statistics rows")
        self.step = step
        self.stats = stats  # device tensors, for code that wants them without a host sync
        self.formats = stats.formats
        self.module_of_row = list(module_of_row)
        self.first_nonfinite: str | None = None  # set by the Inspector when its activation hooks found one
        # Module names in the order autograd made their gradients (closest to the output first), set by the
        # Inspector; empty when unknown (nonfinite_origin is then None).
        self.backward_order: Sequence[str] = ()
        self.autocast: str | None = None  # the autocast format the forward ran under, as the Inspector saw it
        # The recommended scales of recent steps (the Inspector's history): str() shows their median with this one's.
        self.recent_recommended: Sequence[float] = ()
        # Whether an enabled GradScaler skips this step on NaN/Inf (default: a loss scale is there). Without one
        # the optimizer applies them: ``poisoned``, not ``skipped``.
        self.skips = scale is not None if skips is None else bool(skips)
        self.sparse_modules = list(dict.fromkeys(sparse_modules))  # rows judged on stored values (numel too)
        self.hardware: dict[str, Any] | None = None  # memory etc. when the step was inspected (run log only)
        self.readiness: ReportPart | None = None  # readiness_every: this step's ReadinessReport (readiness/report.py)
        self.update: UpdatePart | None = None  # update_every: what this step's optimizer.step() did (UpdateStats)
        self.weights: WeightsPart | None = None  # after NaN/Inf gradients: whether the weights were NaN/Inf too
        self.clip_norm: float | None = None  # the norm the training loop clips the gradients to, where known
        # Distributed runs: NaN/Inf counts per rank and module (see set_rank_origin), on their way to the host.
        self._origin: RankCounts | None = None
        self._origin_modules: list[str] = []
        self._origin_ranks: list[int] = []
        self._inf_by_rank: dict[int, dict[str, int]] | None = None  # made from _origin on first use
        self.inf_origin: str | None = None  # BEFORE_ALLREDUCE or SHARDS once set_rank_origin ran
        # InspectingGradScaler(policy="headroom"): its ScaleDecision after this step (scaling/policies.py).
        self.scale_decision: ReportPart | None = None
        # A copy: GradScaler.update() changes its scale tensor in place after this step.
        self._scale_tensor = None if scale is None else scale.detach().reshape(()).to(torch.float32, copy=True)
        self._snapshot = StatsSnapshot(stats, self._scale_tensor)
        self._total_norm_tensor: torch.Tensor | None = None
        self._summary: dict[str, Any] | None = None
        self._modules: dict[str, Any] | None = None
        self._module_ids: tuple[list[str], np.ndarray] | None = None  # _rows_by_module's, made on first use

    @property
    def total_norm_tensor(self) -> torch.Tensor:
        """total_norm as a float32 0-dim device tensor (no host sync), made on first use."""
        if self._total_norm_tensor is None:
            self._total_norm_tensor = self._total_norm_on_device(self.stats, self._scale_tensor)
        return self._total_norm_tensor

    @staticmethod
    def _total_norm_on_device(stats: TensorStats, scale: torch.Tensor | None) -> torch.Tensor:
        """Unscaled global L2 norm as a float32 0-dim device tensor, NaN/Inf as torch's clip_grad_norm_."""
        norm = stats.sumsq.sum().sqrt()
        if scale is not None:
            norm = norm / scale.to(norm.device, torch.float64)
        nan = stats.nan.sum() > 0
        inf = (stats.posinf + stats.neginf).sum() > 0
        norm = torch.where(inf, torch.full_like(norm, math.inf), norm)
        norm = torch.where(nan, torch.full_like(norm, math.nan), norm)
        return norm.float()

    def annotate(self, parts: Mapping[str, Any] | None) -> None:
        """Takes what a probe or link knows of this step (``{field: value}``, fields of ANNOTATIONS; None or {}:
        nothing). ``rank_origin`` is a distributed.combine.RankOrigin (see set_rank_origin). An unknown field is a
        programming error: TypeError naming it."""
        if not parts:
            return
        unknown = sorted(set(parts) - ANNOTATIONS)
        if unknown:
            raise TypeError(f"StepReport.annotate: no field {', '.join(unknown)} (fields: {sorted(ANNOTATIONS)})")
        for name, value in parts.items():
            if name == "rank_origin":
                self.set_rank_origin(value[0], value[1], value[2], kind=value[3])
            else:
                setattr(self, name, value)

    def set_rank_origin(
        self,
        nonfinite_by_rank: torch.Tensor | RankCounts,
        module_of_column: Sequence[str],
        ranks: Sequence[int] | None = None,
        *,
        kind: str,
    ) -> None:
        """Records where NaN/Inf came from in a distributed run: ``nonfinite_by_rank`` is int64 [world, K] (a
        tensor, or RankCounts standing for one), the NaN/Inf count of each rank's local gradients (``kind``
        BEFORE_ALLREDUCE: DDP) or shards (SHARDS: FSDP2) of K tensors, whose modules ``module_of_column`` names;
        ``ranks`` gives each row's global rank (default: the row number). Copied to the host without a sync."""
        if kind not in ORIGIN_HEADINGS:
            raise ValueError(f"kind must be one of {sorted(ORIGIN_HEADINGS)}, got {kind!r}")
        shape = tuple(nonfinite_by_rank.shape)
        if len(shape) != 2 or shape[1] != len(module_of_column):
            raise ValueError(f"{len(module_of_column)} module names for counts of shape {shape}")
        ranks = list(range(shape[0])) if ranks is None else list(ranks)
        if len(ranks) != shape[0]:
            raise ValueError(f"{len(ranks)} ranks for {shape[0]} rows of counts")
        table = isinstance(nonfinite_by_rank, torch.Tensor)
        self._origin = _CountTable(nonfinite_by_rank) if table else nonfinite_by_rank
        self._origin_modules = list(module_of_column)
        self._origin_ranks = ranks
        self._inf_by_rank = None
        self.inf_origin = kind

    @property
    def optimizer_step_pending(self) -> bool:
        """update_every measures this step and its optimizer step has not run yet, while one is due: the gradients
        are finite (on NaN/Inf a GradScaler skips it, and a loop without one may skip it too). Reads the device."""
        return self.update is not None and not self.update.complete and not self.found_inf

    def ready(self) -> bool:
        """Whether host values can be read without waiting for the device."""
        ready = self._snapshot.ready() and (self._origin is None or self._origin.ready())
        ready = ready and (self.readiness is None or self.readiness.ready())
        ready = ready and (self.weights is None or self.weights.ready())
        return ready and (self.update is None or self.update.ready())

    def gradients_ready(self) -> bool:
        """Whether the gradients' verdict (found_inf, offenders, norms) can be read without waiting."""
        return self._snapshot.ready()

    # ---- host values, computed once on first use ----
    # Two levels: the step's verdict (cheap, vectorised: what the history keeps every step), and the
    # per-module tables (a loop over rows: only when someone looks at modules or writes the log).

    def _get(self) -> dict[str, Any]:
        if self._summary is None:
            h = self._snapshot.host()
            scale = float(h["scale"]) if "scale" in h else None
            names, module_ids = np.unique(np.asarray(self.module_of_row, dtype=object), return_inverse=True)
            nonfinite = np.bincount(module_ids, weights=derive("nonfinite", h).astype(np.float64), minlength=len(names))
            order = sorted((i for i in range(len(names)) if nonfinite[i] > 0), key=lambda i: -nonfinite[i])
            offenders = [str(names[i]) for i in order]
            self._summary = {
                "scale": scale,
                "offenders": offenders,
                "found_inf": bool(offenders),
                "headroom": self._headroom(h),
                "total_norm": self._total_norm(h, scale),
            }
        return self._summary

    def module_norms(self) -> dict[str, float]:
        """Each module's gradient norm, as ``by_module[m]["grad_norm"]`` holds it (unscaled; NaN where a value is
        NaN/Inf), from two sums over the rows: cheap enough for every step, so that what a spike is judged against
        never depends on whether the per-module tables were made (a log open or not)."""
        h = self._snapshot.host()
        scale = self.scale or 1.0
        names, ids = self._rows_by_module()
        sumsq = np.zeros(len(names), dtype=np.float64)
        np.add.at(sumsq, ids, h["sumsq"].astype(np.float64, copy=False))  # in row order, as the module records
        bad = np.bincount(ids, weights=derive("nonfinite", h).astype(np.float64), minlength=len(names))
        return {name: math.nan if bad[i] else math.sqrt(float(sumsq[i])) / scale for i, name in enumerate(names)}

    def _rows_by_module(self) -> tuple[list[str], np.ndarray]:
        """The modules in the order their first row comes, and each row's index into them (made once)."""
        if self._module_ids is None:
            names = list(dict.fromkeys(self.module_of_row))
            index = {name: i for i, name in enumerate(names)}
            self._module_ids = (names, np.array([index[name] for name in self.module_of_row], dtype=np.int64))
        return self._module_ids

    def _get_modules(self) -> dict[str, Any]:
        if self._modules is None:
            self._modules = self._per_module(self._snapshot.host(), self.scale)
        return self._modules

    def _per_module(self, h: dict[str, np.ndarray], scale: float | None) -> dict[str, Any]:
        """Each module's record, fields in the schema's record order (amp_inspect/core/statistics.py): its rows merged
        by each statistic's merge, in row order; a recorded statistic unscaled per row before the merge (amax as
        the optimizer sees each tensor), a derived value computed from the judged merged statistics and then
        unscaled (grad_norm: the root of the judged sum of squares, divided by the scale)."""
        unscale = scale if scale else 1.0
        names, module_ids = self._rows_by_module()
        merged: dict[str, np.ndarray] = {}
        for statistic in STATISTICS:
            # Counts in int64 (exact); float statistics in float64, as Python floats add and compare.
            dtype = np.int64 if statistic.is_count else np.float64
            values = h[statistic.name].astype(dtype, copy=False)
            if statistic.unscale and statistic.in_module_record:
                values = values / unscale**statistic.unscale
            out = np.full((len(names), *values.shape[1:]), statistic.empty, dtype=dtype)
            getattr(np, statistic.ufunc).at(out, module_ids, values)
            if not statistic.is_count:
                out += 0.0  # -0.0 (a zero over a broken negative scale) reads +0.0, as Python's max kept its 0.0
            merged[statistic.name] = out
        fields = module_record_fields(self.formats)
        # As Python ints and floats (what the record holds), read once: indexing numpy per field costs more.
        host = {s.name: merged[s.name].tolist() for s in STATISTICS if s.per != PER_BIN}
        modules: dict[str, dict[str, Any]] = {}
        for i, name in enumerate(names):
            values = {statistic: column_values[i] for statistic, column_values in host.items()}
            values["nonfinite"] = derive("nonfinite", values)
            m: dict[str, Any] = {}
            for key, entry, column in fields:
                if isinstance(entry, Derived):
                    value = float(entry.compute(values))
                    if entry.unscale:
                        value = value / unscale**entry.unscale
                else:
                    value = values[entry.name] if entry.per != PER_FORMAT else values[entry.name][column]
                if entry.unknown_when is not None and entry.unknown_when(values):
                    value = math.nan  # no finite value to measure: unknown, not 0
                m[key] = value
            modules[name] = m
        return {"by_module": modules, "module_hist": dict(zip(names, merged["hist"], strict=True))}

    def _total_norm(self, h: dict[str, np.ndarray], scale: float | None) -> float:
        if int(h["nan"].sum()):
            return math.nan
        if int(h["posinf"].sum() + h["neginf"].sum()):
            return math.inf
        return math.sqrt(float(h["sumsq"].sum())) / (scale or 1.0)

    def _headroom(self, h: dict[str, np.ndarray]) -> Headroom:
        largest = float(h["amax"].max()) if len(h["amax"]) else 0.0
        smallest = float(h["amin_nonzero"].min()) if len(h["amin_nonzero"]) else math.inf
        return measure_headroom(largest, smallest, self.formats[0])

    @property
    def scale(self) -> float | None:
        return self._get()["scale"]

    @property
    def found_inf(self) -> bool:
        return self._get()["found_inf"]

    @property
    def skipped(self) -> bool:
        """NaN/Inf found and an enabled GradScaler skips the optimizer step."""
        return self.skips and self.found_inf

    @property
    def poisoned(self) -> bool:
        """NaN/Inf found and no enabled GradScaler to skip the step: the optimizer applies them."""
        return not self.skips and self.found_inf

    @property
    def scale_problem(self) -> str | None:
        """What is wrong with the loss scale when it is not a finite positive number (None when it is fine)."""
        scale = self.scale
        if scale is None or (math.isfinite(scale) and scale > 0):
            return None
        return (
            f"the loss scale is {scale:g}, not a finite positive number: the scaler's state is broken (a bad "
            "state_dict or update(new_scale)?); every step's gradients are non-finite or wrongly unscaled, so reset "
            "it (e.g. a new GradScaler)"
        )

    @property
    def offenders(self) -> list[str]:
        return self._get()["offenders"]

    @property
    def nonfinite_origin(self) -> str | None:
        """The offender closest to the output in backward order (None without offenders or without the order)."""
        if not self.backward_order:
            return None
        return origin_in_order(self.offenders, self.backward_order)

    @property
    def by_module(self) -> dict[str, dict[str, Any]]:
        return self._get_modules()["by_module"]

    @property
    def total_norm(self) -> float:
        return self._get()["total_norm"]

    @property
    def headroom(self) -> Headroom:
        return self._get()["headroom"]

    @property
    def inf_by_rank(self) -> dict[int, dict[str, int]] | None:
        """In a distributed run (DDP with the inspector's comm hook, or FSDP2): for each rank whose gradients
        held NaN/Inf, the modules and their NaN/Inf counts, most first; {} when no rank had any; None outside
        such runs. ``inf_origin`` says which gradients: BEFORE_ALLREDUCE, the rank's own (it made them, before
        DDP's all-reduce spread them); SHARDS, its FSDP2 shards (it owns those elements, whoever made them)."""
        if self._origin is None:
            return None
        if self._inf_by_rank is not None:  # the log, the history and str() each read it: made once
            return self._inf_by_rank
        counts, final = self._origin.nonzero()
        out: dict[int, dict[str, int]] = {}
        for row, column, count in counts:
            by_module = out.setdefault(self._origin_ranks[row], {})
            name = self._origin_modules[column]
            by_module[name] = by_module.get(name, 0) + count
        ordered = {rank: dict(sorted(m.items(), key=lambda kv: -kv[1])) for rank, m in sorted(out.items())}
        if final:
            self._inf_by_rank = ordered
        return ordered

    @property
    def ranks_with_inf(self) -> list[int] | None:
        """The ranks whose own gradients held NaN/Inf (see inf_by_rank); None outside distributed runs."""
        origin = self.inf_by_rank
        return None if origin is None else list(origin)

    @property
    def recommended_scale(self) -> float | None:
        """The power of two that gives overflow and underflow equal margins (None without data)."""
        if self.scale_problem is not None:
            return None
        return balanced_scale(self.headroom, self.scale)

    def module_hist(self, module: str) -> np.ndarray:
        """The exponent histogram (float32 exponent field, 256 bins) of a module's judged gradients."""
        return self._get_modules()["module_hist"][module]

    # ---- rendering ----

    def to_record(self, with_hist: bool = False) -> dict[str, Any]:
        """The run-log record of this step (schema in amp_inspect/runlog/log.py)."""
        room = self.headroom
        record: dict[str, Any] = {
            "step": self.step,
            "scale": self.scale,
            "skipped": self.skipped,
            "poisoned": self.poisoned,
            "total_norm": self.total_norm,
            "offenders": self.offenders,
            "headroom": {"up": room.up, "down": room.down},
            "recommended_scale": self.recommended_scale,
            "formats": list(self.formats),
            "modules": self.by_module,
        }
        if self.first_nonfinite is not None:
            record["first_nonfinite"] = self.first_nonfinite
        if self.nonfinite_origin is not None:
            record["nonfinite_origin"] = self.nonfinite_origin
        if self.autocast is not None:
            record["autocast"] = self.autocast
        if self.sparse_modules:
            record["sparse_modules"] = self.sparse_modules
        if self.scale_problem is not None:
            record["scale_problem"] = self.scale_problem
        if self.scale_decision is not None:
            record["scale_decision"] = self.scale_decision.to_record()
        origin = self.inf_by_rank
        if origin is not None:
            record["inf_by_rank"] = {str(rank): modules for rank, modules in origin.items()}
            record["inf_origin"] = self.inf_origin
        if self.readiness is not None:
            record["readiness"] = self.readiness.to_record()
        if self.update is not None and (self.update.by_module or self.update.skipped):
            record["update"] = self.update.to_record()
        if self.weights is not None:
            record["weights"] = self.weights.to_record()
        if self.clip_norm is not None:
            record["clip_norm"] = self.clip_norm
        if with_hist:
            from amp_inspect.runlog.log import sparse_hist

            record["hist"] = {name: sparse_hist(h) for name, h in self._get_modules()["module_hist"].items()}
        return record

    def __str__(self) -> str:
        fmt = self.formats[0]
        scale = "none" if self.scale is None else f"{self.scale:g}"
        if not self.found_inf:
            status = "finite"
        elif self.skips:
            status = "NaN/Inf found: GradScaler skips this step"
        else:
            status = "NaN/Inf found and no enabled GradScaler: nothing skips this step, the optimizer applies them"
            status += " (step poisoned)"
        lines = [f"step {self.step}: loss scale {scale}, gradients {status}, total norm {self.total_norm:.4g}"]
        if self.scale_problem is not None:
            lines.append(f"WARNING: {self.scale_problem}")
        if self.sparse_modules:
            shown_sparse = ", ".join(map(shown_name, self.sparse_modules[:MAX_TABLE_ROWS]))
            lines.append(f"sparse gradients (numel counts their stored values): {shown_sparse}")
        lines.append(f"headroom ({fmt}): {self.headroom}{self._recommendation()}")
        if self.first_nonfinite:
            producer = f"first non-finite producer: {shown_name(self.first_nonfinite, limit=None)}"
            weights = self.weights.seen if self.weights is not None else None
            producer_module = finding_module(self.first_nonfinite)
            if weights is not None and weights.into_step == self.step and producer_module in weights.nonfinite:
                producer += " (its weights were NaN/Inf going into this step)"
            lines.append(producer)
        if self.scale_decision is not None:
            lines.append(f"headroom policy: {self.scale_decision}")
        lines += self._origin_lines()
        if self.offenders:
            lines.append(
                "offenders (most NaN/Inf first): " + ", ".join(map(shown_name, self.offenders[:MAX_TABLE_ROWS]))
            )
        for rank, modules in (self.inf_by_rank or {}).items():
            listed = list(modules.items())[:MAX_TABLE_ROWS]
            shown_modules = ", ".join(f"{shown_name(name)} ({count})" for name, count in listed)
            where = f"NaN/Inf came from rank {rank}" if self.inf_origin == BEFORE_ALLREDUCE else f"rank {rank}'s shards"
            lines.append(f"{where}: {shown_modules}")
        modules = self.by_module
        shown = modules_in_trouble(modules)
        if not shown:
            lines.append(f"no module has NaN/Inf or {fmt} overflow, underflow or subnormal gradients")
            return "\n".join(lines)
        headers = ["module", "numel", "nan", "inf", f"{fmt} overflow", "underflow", "subnormal", "zero"]
        headers += ["amax", "grad_norm"]
        rows = []
        for name in shown[:MAX_TABLE_ROWS]:
            m = modules[name]
            rows.append(
                [shown_name(name), str(m["numel"]), str(m["nan"]), str(m["posinf"] + m["neginf"]), str(m["overflow"])]
                + [str(m["underflow"]), str(m["subnormal"]), str(m["zero"]), known(m["amax"])]
                + [known(m["grad_norm"])]
            )
        lines += fixed_width(headers, rows, rule=False)
        if len(shown) > MAX_TABLE_ROWS:
            lines.append(f"... and {len(shown) - MAX_TABLE_ROWS} more modules")
        return "\n".join(lines)

    def _origin_lines(self) -> list[str]:
        """Where this step's NaN/Inf started, said once (attribution.step_origin decides, as for the history): the
        weights when they were already NaN/Inf going into the step, else the activation hooks' finding, else the
        backward order."""
        weights = self.weights.seen if self.weights is not None else None
        lines = [] if weights is None else [weights.describe()]
        if weights is not None and not weights.finite and weights.into_step == self.step and self.found_inf:
            lines.append(
                "NaN/Inf started in: the weights, NaN/Inf before this step's forward pass: a consequence of an "
                "earlier step, not a new origin (summary() names the step that made them)"
            )
            return lines
        everywhere = every_module(self.offenders, self.by_module)
        where = step_origin(self.offenders, self.first_nonfinite, self.nonfinite_origin, everywhere)
        if where is None:
            return lines
        module, how = where
        others = len([m for m in self.offenders if m != module])
        received = f"; {others} module{'s' if others != 1 else ''} upstream received it" if others else ""
        lines.append(f"NaN/Inf started in: {shown_name(module, limit=None)} ({how}){received}")
        return lines

    def _recommendation(self) -> str:
        """The scale to recommend in str(): none without a loss scaler (no scale acts: bf16 runs need none), none
        under a loss-scale policy (its next scale, on the policy's line, is
        the one that acts: two disagreeing numbers would leave the reader to choose) and none for a non-finite
        step; else the median of this step's and the recent steps' recommendations (one step's follows its single
        smallest gradient and jumps by binades from step to step)."""
        rec = self.recommended_scale
        if not self.skips or self.scale_decision is not None or rec is None or self.found_inf:
            return ""
        values = sorted([*self.recent_recommended, rec])
        median = values[len(values) // 2]
        over = f" (median of the last {len(values)} steps)" if len(values) > 1 else ""
        return f"; recommended scale 2^{round(math.log2(median))}{over}"

    def __repr__(self) -> str:
        return f"StepReport(step={self.step}, formats={self.formats})"
