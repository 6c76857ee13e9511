"""The analysis of a run log: its per-step series as arrays, read in one pass (``RunSeries``).

What every view of a log reads: the figures (render/plots.py), the HTML report (render/html_report.py). Torch-free and
matplotlib-free, so analysis never imports rendering.

Terms (core/formats.py defines overflow, subnormal and underflow; gradients/step_report.py the judged picture):

- **unscaled log2 magnitude**: log2 of |gradient| as the optimizer sees it. The logged histograms count the
  *judged* (scaled) gradients by float32 exponent field ``b``, bin ``b`` holding [2^(b-127), 2^(b-126)); the
  unscaled magnitude of that bin starts at ``b - 127 - round(log2(scale))``. GradScaler's scales are powers
  of two, so the shift is exact; another scale is rounded to the nearest power of two here.
- **bands**: where the judged values overflow, turn subnormal or underflow in the format: the format's
  thresholds divided by the loss scale. A larger scale moves every band towards smaller gradients.

Cost: one pass over the records (dense histograms only for the records that have one).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from amp_inspect.core.formats import FORMAT_BOUNDS, NONFINITE_BIN, float32_from_bits
from amp_inspect.evidence.attribution import Blame, blame, every_module, step_origin
from amp_inspect.runlog.log import dense_hist
from amp_inspect.scaling.policies import ScaleDecision
from amp_inspect.scaling.timeline import ScaleChange, decision_from_record, policy_of, scale_changes

FLOAT32_LIMIT = 2.0**128  # above float32's largest finite value
HARDWARE_LIMIT = 2.0**62  # bytes, percent, degrees: no machine reports more (matplotlib's ticks fail near 1e308)
DEFAULT_FORMAT = "fp16"
MAX_ANNOTATED_SKIPS = 8
# The "hardware" fields a series keeps (amp_inspect/runlog/hardware.py writes them): memory, then GPU readings.
MEMORY_KEYS = ("rss_bytes", "torch_allocated", "torch_reserved", "torch_peak", "gpu_mem_used", "gpu_mem_total")
HARDWARE_KEYS = (*MEMORY_KEYS, "gpu_util", "gpu_temp")


@dataclass(frozen=True)
class Bands:
    """A format's thresholds on judged |v| as log2 values (``overflow_from``, ``normal_from``, ``zero_upto``)."""

    fmt: str
    overflow: float
    normal: float
    zero: float

    @classmethod
    def of(cls, fmt: str) -> Bands:
        b = FORMAT_BOUNDS[fmt]
        return cls(
            fmt,
            math.log2(float32_from_bits(b.overflow_from)),
            math.log2(float32_from_bits(b.normal_from)),
            math.log2(float32_from_bits(b.zero_upto)),
        )

    def shifted(self, log2_scale: float) -> tuple[float, float, float]:
        """(overflow, normal, zero) edges in unscaled log2 magnitude at a loss scale of 2^log2_scale."""
        return self.overflow - log2_scale, self.normal - log2_scale, self.zero - log2_scale


def number(value: Any) -> float:
    """A log value as a float, NaN for None or anything that is not a number."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def usable_scale(value: Any) -> float:
    """A loss scale as a float: NaN (no usable scale) unless positive and finite in float32, as GradScaler's
    float32 scale always is (a log of another writer may hold anything; matplotlib's log axis fails near 1e308)."""
    x = number(value)
    return x if 0 < x < FLOAT32_LIMIT else math.nan


def scale_shift(scale: float) -> int:
    """The histogram shift of a loss scale: round(log2(scale)), 0 without a (usable) scale."""
    return round(math.log2(scale)) if math.isfinite(scale) and scale > 0 else 0


@dataclass
class RunSeries:
    """The per-step series of a run log, as arrays, in log order: what every figure and the HTML report read.

    ``fractions[kind]`` is a [modules, records] array of ``count / numel`` for kind in underflow, subnormal,
    zero, overflow and nonfinite (NaN + Inf), NaN where the module is absent from a record. ``hists`` maps a
    record index to ``{module: 256 counts}`` for the records that carry histograms.
    """

    steps: np.ndarray  # int64 [R]
    scale: np.ndarray  # float64 [R], NaN without a scaler (and for a non-finite or non-positive scale)
    skipped: np.ndarray  # bool [R]
    total_norm: np.ndarray  # float64 [R]
    offenders: list[list[str]]
    first_nonfinite: list[str | None]
    fmt: str
    modules: list[str]
    fractions: dict[str, np.ndarray]  # float32 [M, R]
    hists: dict[int, dict[str, np.ndarray]]
    hardware: dict[str, np.ndarray]  # key -> float64 [R], NaN where missing; only keys present somewhere
    hardware_notes: list[str] = field(default_factory=list)  # distinct notes, in order of first appearance
    times: np.ndarray | None = None  # float64 [R] wall-clock seconds, when the records have them
    # bool [R]: NaN/Inf applied by the optimizer (no enabled GradScaler to skip the step); see diagnosis/history.py
    poisoned: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    # InspectingGradScaler(policy="headroom")'s decision after each record's step, None where there is none
    decisions: list[ScaleDecision | None] = field(default_factory=list)
    # The offender closest to the output in backward order, per record (evidence/attribution.py), None where not logged
    nonfinite_origin: list[str | None] = field(default_factory=list)
    # Whether every module with gradients held NaN/Inf, per record (attribution.every_module)
    everywhere: list[bool] = field(default_factory=list)

    @classmethod
    def from_records(cls, records: Sequence[Mapping[str, Any]]) -> RunSeries:
        """One pass over the records of ``amp_inspect.read_log``; tolerant of missing optional keys."""
        n = len(records)
        modules: dict[str, None] = {}
        for r in records:
            modules.update(dict.fromkeys(r.get("modules") or {}))
            for name in r.get("hist") or {}:
                modules.setdefault(name)
        names = list(modules)
        index = {m: i for i, m in enumerate(names)}
        kinds = ("underflow", "subnormal", "zero", "overflow", "nonfinite")
        fractions = {k: np.full((len(names), n), np.nan, dtype=np.float32) for k in kinds}
        hists: dict[int, dict[str, np.ndarray]] = {}
        hardware: dict[str, np.ndarray] = {}
        notes: dict[str, None] = {}
        fmt = None
        for j, r in enumerate(records):
            if fmt is None and r.get("formats"):
                fmt = str(r["formats"][0])
            for name, m in (r.get("modules") or {}).items():
                count = int(m.get("numel") or 0)
                if count <= 0:
                    continue
                i = index[name]
                for k in ("underflow", "subnormal", "zero", "overflow"):
                    fractions[k][i, j] = int(m.get(k) or 0) / count
                bad = sum(int(m.get(k) or 0) for k in ("nan", "posinf", "neginf"))
                fractions["nonfinite"][i, j] = bad / count
            if r.get("hist"):
                hists[j] = {name: np.asarray(dense_hist(h), dtype=np.int64) for name, h in r["hist"].items()}
            for key, value in (r.get("hardware") or {}).items():
                if key in HARDWARE_KEYS and value is not None:
                    x = number(value)  # NaN for what no machine reports (a log from elsewhere may hold it)
                    hardware.setdefault(key, np.full(n, np.nan))[j] = x if 0 <= x < HARDWARE_LIMIT else np.nan
            if r.get("hardware_note"):
                notes.setdefault(str(r["hardware_note"]))
        hardware = {key: values for key, values in hardware.items() if np.isfinite(values).any()}
        times = np.array([number(r.get("time")) for r in records])
        # Logs from before "poisoned" existed called a no-scaler NaN/Inf step "skipped" (as diagnosis/history.py reads
        # them).
        poisoned = np.array(
            [
                bool(r["poisoned"]) if "poisoned" in r else bool(r.get("skipped")) and r.get("scale") is None
                for r in records
            ],
            dtype=bool,
        )
        skipped = np.array([bool(r.get("skipped", False)) for r in records], dtype=bool) & ~poisoned
        return cls(
            steps=np.array([int(r.get("step", j)) for j, r in enumerate(records)], dtype=np.int64),
            scale=np.array([usable_scale(r.get("scale")) for r in records]),
            skipped=skipped,
            total_norm=np.array([number(r.get("total_norm")) for r in records]),
            offenders=[[str(m) for m in r.get("offenders") or []] for r in records],
            first_nonfinite=[None if r.get("first_nonfinite") is None else str(r["first_nonfinite"]) for r in records],
            fmt=fmt if fmt in FORMAT_BOUNDS else DEFAULT_FORMAT,
            modules=names,
            fractions=fractions,
            hists=hists,
            hardware=hardware,
            hardware_notes=list(notes),
            times=times if np.isfinite(times).any() else None,
            poisoned=poisoned,
            decisions=[decision_from_record(r["scale_decision"]) if r.get("scale_decision") else None for r in records],
            nonfinite_origin=[
                None if r.get("nonfinite_origin") is None else str(r["nonfinite_origin"]) for r in records
            ],
            everywhere=[every_module([str(m) for m in r.get("offenders") or []], r.get("modules")) for r in records],
        )

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def bands(self) -> Bands:
        return Bands.of(self.fmt)

    @property
    def has_scale(self) -> bool:
        return bool(np.isfinite(self.scale).any())

    @property
    def policy(self) -> str:
        """The loss-scale policy the log was written under (scale_timeline.policy_of)."""
        return policy_of(self.decisions)

    def scale_changes(self) -> list[ScaleChange]:
        """The policy's decisions that changed the scale or skipped their step (scale_timeline.scale_changes)."""
        return scale_changes(self.steps.tolist(), self.decisions) if self.decisions else []

    @property
    def restarts(self) -> int:
        """How many times the step number went back (or repeated): a resumed run appending to the same log."""
        return int((np.diff(self.steps) <= 0).sum())

    def line(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(steps, values) for a line plot, with a NaN gap wherever the step goes back, so a resumed run's
        records are drawn over the earlier ones instead of joined to them by a line running backwards."""
        values = np.asarray(values, dtype=np.float64)
        back = np.flatnonzero(np.diff(self.steps) <= 0) + 1
        if not back.size:
            return self.steps.astype(np.float64), values
        return np.insert(self.steps.astype(np.float64), back, np.nan), np.insert(values, back, np.nan)

    def by_step(self, indices: Sequence[int] | None = None) -> np.ndarray:
        """Record indices (of ``indices``, default all) in step order, one per step: the last one logged."""
        idx = np.arange(len(self)) if indices is None else np.asarray(indices, dtype=np.int64)
        if not idx.size:
            return idx
        last = {int(self.steps[j]): int(j) for j in idx}  # later records of a step replace earlier ones
        return np.array([last[step] for step in sorted(last)], dtype=np.int64)

    def offender_counts(self) -> Counter:
        """Module -> skipped steps it was an offender in (as ``history.summarize`` counts them)."""
        return Counter(m for offs, skip in zip(self.offenders, self.skipped, strict=True) if skip for m in offs)

    def origin(self, j: int) -> tuple[str, str] | None:
        """(module, evidence) of where record ``j``'s NaN/Inf started (attribution.step_origin)."""
        origin = self.nonfinite_origin[j] if self.nonfinite_origin else None
        everywhere = self.everywhere[j] if self.everywhere else False
        return step_origin(self.offenders[j], self.first_nonfinite[j], origin, everywhere)

    def blame(self, steps: np.ndarray | None = None) -> Blame:
        """Where the NaN/Inf of the skipped steps (or of the records ``steps`` masks) started: attribution.blame,
        the ranking every surface shows."""
        mask = self.skipped if steps is None else steps
        origins = self.nonfinite_origin or [None] * len(self)
        everywhere = self.everywhere or [False] * len(self)
        return blame(
            (self.offenders[j], self.first_nonfinite[j], origins[j], everywhere[j]) for j in np.flatnonzero(mask)
        )

    def small_trouble(self) -> dict[str, float]:
        """Module -> mean underflow + subnormal fraction over the records that have it."""
        both = self.fractions["underflow"] + self.fractions["subnormal"]
        out = {}
        for i, name in enumerate(self.modules):
            row = both[i][np.isfinite(both[i])]
            out[name] = float(row.mean()) if row.size else 0.0
        return out

    def trouble_order(self) -> list[str]:
        """Modules, most trouble first: skips caused, then non-finite, overflow, underflow + subnormal fractions."""
        offenders = self.offender_counts()
        small = self.small_trouble()

        def peak(kind: str, i: int) -> float:
            row = self.fractions[kind][i]
            row = row[np.isfinite(row)]
            return float(row.max()) if row.size else 0.0

        key = {
            m: (offenders[m], peak("nonfinite", i), peak("overflow", i), small[m]) for i, m in enumerate(self.modules)
        }
        return sorted(self.modules, key=lambda m: tuple(-x for x in key[m]))

    def default_module(self) -> tuple[str | None, str]:
        """The module ``heatmap_over_time`` shows by default, and why: the top offender with histograms, else
        the one with the most underflow + subnormal, else the one whose largest gradients came closest to
        overflow (highest histogram bin at the latest step). (None, "") without histograms."""
        with_hist = [m for m in self.modules if any(m in h for h in self.hists.values())]
        if not with_hist:
            return None, ""
        for m, _ in self.blame().ranked():
            if m in with_hist:
                return m, "top offender"
        small = self.small_trouble()
        best = max(with_hist, key=lambda m: small.get(m, 0.0))
        if small.get(best, 0.0) > 0:
            return best, "most underflow + subnormal"
        latest = self.hists[max(j for j, h in self.hists.items() if any(m in h for m in with_hist))]

        def top_bin(m: str) -> int:
            counts = latest.get(m)
            finite = np.flatnonzero(counts[:NONFINITE_BIN]) if counts is not None else np.array([], dtype=int)
            return int(finite[-1]) if finite.size else -1

        return max(with_hist, key=top_bin), "closest to overflow"

    def skip_list(self, limit: int = MAX_ANNOTATED_SKIPS) -> list[int]:
        """Record indices of up to ``limit`` skipped steps worth a label: the first skip of each run of
        consecutive skips, then further skips with an offender not yet shown, in step order."""
        skipped = np.flatnonzero(self.skipped)
        firsts = [int(j) for j in skipped if j == 0 or not self.skipped[j - 1]]
        chosen: list[int] = []
        seen: set[str] = set()
        for j in firsts:
            if len(chosen) < limit:
                chosen.append(j)
                seen.update(self.offenders[j][:1])
        for j in skipped:
            if len(chosen) >= limit:
                break
            if int(j) not in chosen and self.offenders[j][:1] and self.offenders[j][0] not in seen:
                chosen.append(int(j))
                seen.add(self.offenders[j][0])
        return sorted(chosen)


def series_of(records: Sequence[Mapping[str, Any]] | RunSeries) -> RunSeries:
    """``records`` as a RunSeries (a RunSeries is returned as it is, so callers can share one)."""
    return records if isinstance(records, RunSeries) else RunSeries.from_records(records)
