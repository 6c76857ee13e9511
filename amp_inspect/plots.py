"""Figures of a run log: loss scale, exponent heatmaps with the format's bands, fractions, norms, memory.

Every figure is read from one analysis object, ``RunSeries.from_records(amp_inspect.read_log(path))``, and
returned as a ``matplotlib.figure.Figure`` made directly (Agg canvas, no pyplot state). ``save_all`` writes
them all as PNG. Plotting needs matplotlib, which the core package does not depend on.

Terms (formats.py defines overflow, subnormal and underflow; report.py the judged picture):

- **unscaled log2 magnitude**: log2 of |gradient| as the optimizer sees it. The logged histograms count the
  *judged* (scaled) gradients by float32 exponent field ``b``, bin ``b`` holding [2^(b-127), 2^(b-126)); the
  unscaled magnitude of that bin starts at ``b - 127 - round(log2(scale))``. GradScaler's scales are powers
  of two, so the shift is exact; another scale is rounded to the nearest power of two here.
- **bands**: where the judged values overflow, turn subnormal or underflow in the format: the format's
  thresholds divided by the loss scale. A larger scale moves every band towards smaller gradients.

Cost: reading the series is one pass over the records (dense histograms only for the records that have one);
each figure renders in well under a second for logs of thousands of records and tens of modules.
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from .formats import FORMAT_BOUNDS
from .runlog import HIST_BINS, dense_hist

EXPONENT_BIAS = 127  # float32: bin 127 is [1, 2)
FLOAT32_LIMIT = 2.0**128  # above float32's largest finite value
HARDWARE_LIMIT = 2.0**62  # bytes, percent, degrees: no machine reports more (matplotlib's ticks fail near 1e308)
ZERO_BIN = 0  # zeros and float32 subnormals
NONFINITE_BIN = HIST_BINS - 1  # Inf and NaN
DEFAULT_FORMAT = "fp16"
NAME_WIDTH = 34  # characters of a module name in an axis label
MAX_HEATMAP_MODULES = 40
MAX_LINE_MODULES = 6
MAX_ANNOTATED_SKIPS = 8
BAND_MARGIN = 3  # binades shown beyond the outermost data or band edge
NEAR_EDGE = 8  # binades: a band edge this close to a module's data is drawn in its over-time heatmap
FIG_WIDTH = 11.0  # inches; at DPI this is 1100 px, the width of the HTML report's column
DPI = 100

SKIP_COLOR = "#d62728"
NAN_COLOR = "#9400d3"
BAND_STYLE = {  # region -> (fill colour, edge colour, label)
    "underflow": ("#9ecae1", "#08519c", "underflow to 0"),
    "subnormal": ("#fdd0a2", "#d94801", "subnormal"),
    "overflow": ("#f4a0a0", "#a50f15", "overflow to Inf"),
}
HARDWARE_SERIES = (  # key, label, line style
    ("rss_bytes", "process RSS", "-"),
    ("torch_allocated", "torch allocated", "-"),
    ("torch_reserved", "torch reserved", "-"),
    ("torch_peak", "torch peak allocated", ":"),
    ("gpu_mem_used", "GPU memory used", "-"),
    ("gpu_mem_total", "GPU memory total", "--"),
)
FIGURES = ("loss_scale", "heatmap_latest", "heatmap_over_time", "fractions", "total_norm", "memory")


# ---------------------------------------------------------------- text helpers


def mpl_text(text: str) -> str:
    """``text`` safe for a matplotlib label: a ``$`` would otherwise start mathtext."""
    return text.replace("$", r"\$")


def short_name(name: str, width: int = NAME_WIDTH) -> str:
    """A module name cut to ``width`` characters, keeping its end (the layer) after a leading ``…``.

    The cut falls on a ``.`` when one is near, so ``model.encoder.layers.11.self_attn.q_proj`` becomes
    ``…layers.11.self_attn.q_proj``, not ``…rs.11.self_attn.q_proj``.
    """
    if len(name) <= width:
        return name
    tail = name[-(width - 1) :]
    dot = tail.find(".")
    if 0 <= dot < width // 3:
        tail = tail[dot + 1 :]
    return "…" + tail


def short_names(names: Sequence[str], width: int = NAME_WIDTH) -> list[str]:
    """``short_name`` of each name, widened where two would read the same, and made safe for matplotlib."""
    out = [short_name(n, width) for n in names]
    for _ in range(4):
        counts = Counter(out)
        clashes = [i for i, s in enumerate(out) if counts[s] > 1]
        if not clashes:
            break
        width += 12
        for i in clashes:
            out[i] = short_name(names[i], width)
    return [mpl_text(s) for s in out]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _f32(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


# ---------------------------------------------------------------- the analysis object


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
        return cls(fmt, math.log2(_f32(b.overflow_from)), math.log2(_f32(b.normal_from)), math.log2(_f32(b.zero_upto)))

    def shifted(self, log2_scale: float) -> tuple[float, float, float]:
        """(overflow, normal, zero) edges in unscaled log2 magnitude at a loss scale of 2^log2_scale."""
        return self.overflow - log2_scale, self.normal - log2_scale, self.zero - log2_scale


def _float(value: Any) -> float:
    """A log value as a float, NaN for None or anything that is not a number."""
    if isinstance(value, bool) or value is None:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _scale(value: Any) -> float:
    """A loss scale as a float: NaN (no usable scale) unless positive and finite in float32, as GradScaler's
    float32 scale always is (a log of another writer may hold anything; matplotlib's log axis fails near 1e308)."""
    x = _float(value)
    return x if 0 < x < FLOAT32_LIMIT else math.nan


def _log2_scale(scale: float) -> int:
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
    # bool [R]: NaN/Inf applied by the optimizer (no enabled GradScaler to skip the step); see history.py
    poisoned: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

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
        hardware_keys = {key for key, _, _ in HARDWARE_SERIES} | {"gpu_util", "gpu_temp"}
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
                if key in hardware_keys and value is not None:
                    x = _float(value)  # NaN for what no machine reports (a log from elsewhere may hold it)
                    hardware.setdefault(key, np.full(n, np.nan))[j] = x if 0 <= x < HARDWARE_LIMIT else np.nan
            if r.get("hardware_note"):
                notes.setdefault(str(r["hardware_note"]))
        hardware = {key: values for key, values in hardware.items() if np.isfinite(values).any()}
        times = np.array([_float(r.get("time")) for r in records])
        # Logs from before "poisoned" existed called a no-scaler NaN/Inf step "skipped" (as history.py reads them).
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
            scale=np.array([_scale(r.get("scale")) for r in records]),
            skipped=skipped,
            total_norm=np.array([_float(r.get("total_norm")) for r in records]),
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

    def unavailable(self) -> dict[str, str]:
        """Figure name -> why it has nothing to draw, for the figures that have nothing (else absent)."""
        out = {}
        if not len(self):
            out.update(dict.fromkeys(FIGURES, "The log has no records."))
        if not self.hists:
            message = (
                "No exponent histograms in this log (they are written every hist_every steps; the run may be "
                "shorter than that, or hist_every=0)."
            )
            out.update(heatmap_latest=message, heatmap_over_time=message)
        if not self.modules:
            out["fractions"] = "No per-module statistics in this log."
        if not any(key in self.hardware for key, _, _ in HARDWARE_SERIES):
            note = "; ".join(self.hardware_notes) or 'the records carry no "hardware" fields'
            out["memory"] = f"Memory metrics not available: {note}"
        return out

    def offender_counts(self) -> Counter:
        """Module -> skipped steps it was an offender in (as ``history.summarize`` counts them)."""
        return Counter(m for offs, skip in zip(self.offenders, self.skipped, strict=True) if skip for m in offs)

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
        for m, _ in self.offender_counts().most_common():
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


# ---------------------------------------------------------------- figure helpers


def _figure(height: float) -> Figure:
    fig = Figure(figsize=(FIG_WIDTH, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _message_figure(title: str, message: str) -> Figure:
    """A small figure that says plainly why there is nothing to draw."""
    fig = _figure(1.6)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(mpl_text(title), loc="left", fontsize=12)
    wrapped = "\n".join(textwrap.wrap(message, 110))
    ax.text(0.5, 0.45, mpl_text(wrapped), ha="center", va="center", fontsize=12, color="#555555")
    return fig


def _mark_skips(ax: Any, series: RunSeries) -> None:
    """Faint red vertical lines at the skipped steps (once per step, also when a resumed run repeats it)."""
    for step in np.unique(series.steps[series.skipped]):
        ax.axvline(step, color=SKIP_COLOR, alpha=0.25, lw=1, zorder=0)


def _step_axis(ax: Any, series: RunSeries) -> None:
    """Integer step ticks, and a sensible width around a single record."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(series) == 1:
        ax.set_xlim(series.steps[0] - 1, series.steps[0] + 1)


def _log_fraction_norm(values: np.ndarray) -> LogNorm:
    positive = values[np.isfinite(values) & (values > 0)]
    low = float(positive.min()) if positive.size else 1e-6
    return LogNorm(vmin=min(max(low, 1e-10), 1e-3), vmax=1.0)


def _hist_fractions(counts: np.ndarray) -> np.ndarray:
    total = counts.sum()
    return counts / total if total > 0 else np.zeros(len(counts))


# ---------------------------------------------------------------- the figures


def loss_scale(records: Sequence[Mapping[str, Any]] | RunSeries) -> Figure:
    """Loss scale over steps (log2 axis); skipped steps as red markers, up to 8 numbered and explained below."""
    s = series_of(records)
    if not len(s):
        return _message_figure("Loss scale", "The log has no records.")
    if not s.has_scale and not s.skipped.any() and not s.poisoned.any():
        return _message_figure(
            "Loss scale",
            f"No loss scale in this log (a run without GradScaler) and no skipped step in {len(s)} records.",
        )
    chosen = s.skip_list()
    fig = _figure(4.2 + 0.22 * len(chosen))
    ax = fig.add_subplot()
    title = "Loss scale"
    if s.has_scale:
        ax.step(*s.line(s.scale), where="post", color="#1f77b4", lw=1.8, label="loss scale")
        ax.plot(s.steps, s.scale, "o", color="#1f77b4", ms=2.5)
        ax.set_yscale("log", base=2)
        y = np.where(np.isfinite(s.scale), s.scale, np.nanmin(s.scale))
        ax.set_ylabel("loss scale (log2)")
        lo, hi = np.nanmin(s.scale), np.nanmax(s.scale)
        ax.set_ylim(lo / 2.8 if lo / 2.8 > 0 else lo, hi * 2.8)
    else:
        y = np.ones(len(s))
        ax.set_yticks([])
        ax.set_ylim(0.5, 1.5)
        title += " (none in this log: no GradScaler; skipped steps shown on one line)"
    skipped = np.flatnonzero(s.skipped)
    if skipped.size:
        ax.plot(s.steps[skipped], y[skipped], "v", color=SKIP_COLOR, ms=8, label=f"skipped step ({skipped.size})")
    poisoned = np.flatnonzero(s.poisoned)
    if poisoned.size:
        label = f"poisoned step ({poisoned.size}): NaN/Inf applied, no GradScaler skipped it"
        ax.plot(s.steps[poisoned], y[poisoned], "X", color="#5a0000", ms=8, label=label)
    notes = []
    for number, j in enumerate(chosen, start=1):
        ax.annotate(
            str(number),
            (s.steps[j], y[j]),
            xytext=(0, 9 if number % 2 else 19),
            textcoords="offset points",
            ha="center",
            fontsize=9,
            color=SKIP_COLOR,
            fontweight="bold",
        )
        who = s.offenders[j][0] if s.offenders[j] else "no module named"
        more = f" (+{len(s.offenders[j]) - 1} more)" if len(s.offenders[j]) > 1 else ""
        line = f"{number}: step {s.steps[j]}: {short_name(who, 60)}{more}"
        if s.first_nonfinite[j]:
            line += f" | first non-finite: {_shorten(s.first_nonfinite[j], 80)}"
        notes.append(mpl_text(line))
    if len(skipped) > len(chosen):
        notes.append(f"... {len(skipped) - len(chosen)} more skipped steps, see the offenders table")
    if notes:
        ax.set_xlabel("step\n\n" + "\n".join(notes), loc="left", fontsize=9)
        ax.xaxis.label.set_horizontalalignment("left")
    else:
        ax.set_xlabel("step")
    rate = skipped.size / len(s)
    title += f": {skipped.size} of {len(s)} inspected steps skipped ({rate:.1%})"
    if poisoned.size:
        title += f", {poisoned.size} poisoned"
    ax.set_title(title, loc="left", fontsize=12)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="lower right", fontsize=9)
    _step_axis(ax, s)
    return fig


def _band_spans(ax: Any, edges: tuple[float, float, float], *, vertical: bool, lo: float, hi: float) -> None:
    """Shade the underflow, subnormal and overflow regions between ``lo`` and ``hi`` and draw their edges."""
    overflow, normal, zero = edges
    spans = {"underflow": (lo, zero), "subnormal": (zero, normal), "overflow": (overflow, hi)}
    span = ax.axvspan if vertical else ax.axhspan
    line = ax.axvline if vertical else ax.axhline
    for region, (a, b) in spans.items():
        fill, edge, label = BAND_STYLE[region]
        if b > a:
            span(a, b, color=fill, alpha=0.55, zorder=0, lw=0)
        line(b if region != "overflow" else a, color=edge, lw=1.4, ls="--", zorder=3)


def heatmap_latest(records: Sequence[Mapping[str, Any]] | RunSeries) -> Figure:
    """Modules x unscaled log2 magnitude of the latest step with histograms; the format's bands at its scale.

    Colour is the fraction of the module's gradient elements in each binade (log colour scale); the narrow
    columns on either side hold zeros (and float32 subnormals) and Inf/NaN.
    """
    s = series_of(records)
    if not s.hists:
        return _message_figure("Gradient exponents, latest step", s.unavailable()["heatmap_latest"])
    j = max(s.hists)
    hist = s.hists[j]
    names = [m for m in s.modules if m in hist]
    title_extra = ""
    if len(names) > MAX_HEATMAP_MODULES:
        keep = {m for m in s.trouble_order() if m in hist}
        keep = set([m for m in s.trouble_order() if m in keep][:MAX_HEATMAP_MODULES])
        title_extra = f" ({MAX_HEATMAP_MODULES} of {len(names)} modules, those with the most trouble)"
        names = [m for m in names if m in keep]
    counts = np.stack([hist[m] for m in names])  # [M, 256]
    frac = counts / np.maximum(counts.sum(axis=1, keepdims=True), 1)
    shift = _log2_scale(s.scale[j])
    edges = s.bands.shifted(shift)
    body = frac[:, 1:NONFINITE_BIN]  # bins 1..254
    occupied = np.flatnonzero(body.sum(axis=0) > 0) + 1
    x_of_bin = np.arange(HIST_BINS) - EXPONENT_BIAS - shift
    lo_candidates = [edges[2]] + ([x_of_bin[occupied[0]]] if occupied.size else [])
    hi_candidates = [edges[0]] + ([x_of_bin[occupied[-1]] + 1] if occupied.size else [])
    lo = max(math.floor(min(lo_candidates)) - BAND_MARGIN, x_of_bin[1])
    hi = min(math.ceil(max(hi_candidates)) + BAND_MARGIN, x_of_bin[NONFINITE_BIN])
    bins = np.arange(HIST_BINS)[(x_of_bin >= lo) & (x_of_bin < hi)]
    bins = bins[(bins > ZERO_BIN) & (bins < NONFINITE_BIN)]

    fig = _figure(2.2 + 0.26 * len(names))
    gs = fig.add_gridspec(1, 4, width_ratios=[0.7, 26, 0.7, 0.5], wspace=0.02)
    ax_zero, ax, ax_inf, cax = (fig.add_subplot(gs[0, i]) for i in range(4))
    norm = _log_fraction_norm(frac)
    masked = np.ma.masked_less_equal(frac, 0)
    cmap = "viridis"
    y_edges = np.arange(len(names) + 1)
    x_edges = np.append(x_of_bin[bins], x_of_bin[bins[-1]] + 1) if bins.size else np.array([lo, hi])
    _band_spans(ax, edges, vertical=True, lo=lo, hi=hi)
    mesh = ax.pcolormesh(
        x_edges,
        y_edges,
        masked[:, bins] if bins.size else np.ma.masked_all((len(names), 1)),
        cmap=cmap,
        norm=norm,
        zorder=1,
    )
    ax.set_xlim(lo, hi)
    ax.set_ylim(len(names), 0)
    ax.set_yticks([])
    ax.set_xlabel("unscaled log2 |gradient| (binade start; the optimizer's values)")
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for region, x in (("underflow", edges[2]), ("subnormal", (edges[2] + edges[1]) / 2), ("overflow", edges[0])):
        if lo <= x <= hi:
            ha = {"underflow": "right", "subnormal": "center", "overflow": "left"}[region]
            ax.text(
                x,
                1.005,
                " " + BAND_STYLE[region][2] + " ",
                transform=trans,
                ha=ha,
                va="bottom",
                fontsize=8,
                color=BAND_STYLE[region][1],
            )
    for side, col, label in ((ax_zero, ZERO_BIN, "0"), (ax_inf, NONFINITE_BIN, "Inf\nNaN")):
        side.pcolormesh([0, 1], y_edges, masked[:, [col]], cmap=cmap, norm=norm)
        side.set_ylim(len(names), 0)
        side.set_xticks([0.5], [label], fontsize=8)
        side.set_yticks([])
        side.set_facecolor("#f4f4f4")
    ax_zero.set_yticks(np.arange(len(names)) + 0.5, short_names(names), fontsize=8)
    offenders = set(s.offenders[j])
    for tick, name in zip(ax_zero.get_yticklabels(), names, strict=True):
        if name in offenders:
            tick.set_color(SKIP_COLOR)
    cb = fig.colorbar(mesh, cax=cax)
    cb.set_label("fraction of the module's elements", fontsize=8)
    scale = "no loss scale" if not np.isfinite(s.scale[j]) else f"loss scale 2^{shift}"
    status = ", skipped" if s.skipped[j] else ""
    ax.set_title(
        mpl_text(f"Gradient exponents at step {s.steps[j]} ({scale}{status}), {s.fmt} bands{title_extra}"),
        loc="left",
        fontsize=12,
        pad=14,
    )
    return fig


def heatmap_over_time(records: Sequence[Mapping[str, Any]] | RunSeries, module: str | None = None) -> Figure:
    """One module's exponent histogram (y, unscaled log2 magnitude) over the steps with histograms (x).

    ``module`` defaults to ``RunSeries.default_module()`` (named with its reason in the title). The bands
    follow the loss scale step by step; the strips above and below hold the Inf/NaN and zero fractions; red
    ticks on top mark skipped steps.
    """
    s = series_of(records)
    chosen, reason = s.default_module()
    why = f" ({reason})" if module is None or module == chosen else ""
    module = chosen if module is None else module
    cols = [int(j) for j in s.by_step([j for j in sorted(s.hists) if module in s.hists[j]])]
    if module is None or not cols:
        what = "No exponent histograms in this log" if module is None else f"No histograms of module {module!r}"
        return _message_figure("Gradient exponents over time", what + ".")
    shifts = np.array([_log2_scale(s.scale[j]) for j in cols])
    frac = np.stack([_hist_fractions(s.hists[j][module]) for j in cols], axis=1)  # [256, C]
    # Re-index every column on the unscaled exponent: row e holds bin e + 127 + shift.
    occupied = [np.flatnonzero(frac[1:NONFINITE_BIN, c] > 0) + 1 for c in range(len(cols))]
    data_lo = min((o[0] - EXPONENT_BIAS - sh for o, sh in zip(occupied, shifts, strict=True) if o.size), default=0)
    data_hi = max((o[-1] - EXPONENT_BIAS - sh + 1 for o, sh in zip(occupied, shifts, strict=True) if o.size), default=0)
    bands = s.bands
    log2_scales = np.array([_log2_scale(x) for x in s.scale], dtype=float)
    edge_series = np.array([bands.shifted(x) for x in log2_scales])  # [R, 3]
    # The y range is the data plus a margin, stretched to reach a band edge only when one is near, so the
    # module's histogram keeps its resolution; edges further away are named in a note instead.
    lo, hi = math.floor(data_lo) - BAND_MARGIN, math.ceil(data_hi) + BAND_MARGIN
    far = []
    for column, below in ((1, True), (2, True), (0, False)):  # nearest edges first
        edge = edge_series[:, column]
        if below and edge.min() >= lo - NEAR_EDGE:
            lo = min(lo, math.floor(edge.min()) - BAND_MARGIN)
        elif not below and edge.max() <= hi + NEAR_EDGE:
            hi = max(hi, math.ceil(edge.max()) + BAND_MARGIN)
    for column, label in ((0, "overflow from"), (1, "subnormal below"), (2, "underflow to 0 at or below")):
        edge = edge_series[:, column]
        if edge.max() < lo or edge.min() > hi:
            a, b = round(edge.min()), round(edge.max())
            far.append(f"{label} 2^{a}" + (f" to 2^{b} (moves with the scale)" if a != b else ""))
    exps = np.arange(lo, hi)
    grid = np.zeros((len(exps), len(cols)))
    for c, sh in enumerate(shifts):
        b = exps + EXPONENT_BIAS + sh
        ok = (b > ZERO_BIN) & (b < NONFINITE_BIN)
        grid[ok, c] = frac[b[ok], c]

    steps = s.steps[cols].astype(float)
    if len(steps) > 1:
        mids = (steps[1:] + steps[:-1]) / 2
        x_edges = np.concatenate([[steps[0] - (mids[0] - steps[0])], mids, [steps[-1] + (steps[-1] - mids[-1])]])
    else:
        x_edges = np.array([steps[0] - 0.5, steps[0] + 0.5])
    # Each column is centred on its step; the outer halves stop half a step beyond the log's first and last
    # steps (with histograms every 5 steps from step 0, the axis would otherwise start at step -2.5).
    x_edges[0] = max(x_edges[0], float(s.steps.min()) - 0.5)
    x_edges[-1] = min(x_edges[-1], float(s.steps.max()) + 0.5)

    fig = _figure(6.0)
    gs = fig.add_gridspec(3, 2, height_ratios=[0.6, 14, 0.6], width_ratios=[40, 0.6], hspace=0.02)
    ax_inf = fig.add_subplot(gs[0, 0])
    ax = fig.add_subplot(gs[1, 0], sharex=ax_inf)
    ax_zero = fig.add_subplot(gs[2, 0], sharex=ax_inf)
    cax = fig.add_subplot(gs[:, 1])
    norm = _log_fraction_norm(frac)
    cmap = "viridis"
    # Bands over every record's step, held until the next record (the scale in force at that step).
    shown = s.by_step()
    shown = shown[(s.steps[shown] >= x_edges[0]) & (s.steps[shown] <= x_edges[-1])]
    xs = np.append(s.steps[shown].astype(float), x_edges[-1])
    xs[0] = min(xs[0], x_edges[0])
    e = np.vstack([edge_series[shown], edge_series[shown][-1:]])
    for region, (a, b) in {
        "underflow": (np.full(len(xs), lo), e[:, 2]),
        "subnormal": (e[:, 2], e[:, 1]),
        "overflow": (e[:, 0], np.full(len(xs), hi)),
    }.items():
        fill, edge, label = BAND_STYLE[region]
        ax.fill_between(xs, a, b, step="post", color=fill, alpha=0.55, lw=0, zorder=0, label=label)
        ax.step(xs, b if region != "overflow" else a, where="post", color=edge, lw=1.3, ls="--", zorder=3)
    mesh = ax.pcolormesh(x_edges, np.append(exps, hi), np.ma.masked_less_equal(grid, 0), cmap=cmap, norm=norm, zorder=1)
    ax.set_ylim(lo, hi)
    ax.set_ylabel("unscaled log2 |gradient|")
    ax.grid(True, alpha=0.2, zorder=2)
    fig.legend(
        *ax.get_legend_handles_labels(), loc="outside lower right", fontsize=8, ncols=3, title=None, frameon=False
    )
    for strip, b, label in ((ax_inf, NONFINITE_BIN, "Inf/NaN"), (ax_zero, ZERO_BIN, "0")):
        strip.pcolormesh(x_edges, [0, 1], np.ma.masked_less_equal(frac[[b], :], 0), cmap=cmap, norm=norm)
        strip.set_yticks([0.5], [label], fontsize=8)
        strip.set_facecolor("#f4f4f4")
    ax_inf.tick_params(labelbottom=False)
    ax.tick_params(labelbottom=False)
    xlabel = "step (columns: steps with histograms)"
    if far:
        xlabel += "\nband edges off the plot: " + "; ".join(far)
    ax_zero.set_xlabel(xlabel)
    ax_zero.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_zero.set_xlim(x_edges[0], x_edges[-1])
    trans = blended_transform_factory(ax_inf.transData, ax_inf.transAxes)
    skipped = s.steps[shown][s.skipped[shown]]
    if skipped.size:
        ax_inf.plot(skipped, np.full(skipped.size, 1.0), "v", color=SKIP_COLOR, ms=6, transform=trans, clip_on=False)
    cb = fig.colorbar(mesh, cax=cax)
    cb.set_label("fraction of the module's elements", fontsize=8)
    ax_inf.set_title(
        mpl_text(f"Gradient exponents of {short_name(module, 60)}{why} over time, {s.fmt} bands at each step's scale"),
        loc="left",
        fontsize=12,
        pad=10,
    )
    return fig


def fractions(records: Sequence[Mapping[str, Any]] | RunSeries, modules: Sequence[str] | None = None) -> Figure:
    """Underflow, subnormal and zero fractions of a few modules over steps (three panels, log y).

    ``modules`` defaults to the ``MAX_LINE_MODULES`` with the most underflow + subnormal, then the most
    zeros; modules with none of the three are left out. A fraction of 0 is not drawn on the log axis.
    """
    s = series_of(records)
    if not s.modules or not len(s):
        return _message_figure("Underflow, subnormal and zero fractions", s.unavailable()["fractions"])
    if modules is None:
        small = s.small_trouble()
        zeros = {m: float(np.nan_to_num(s.fractions["zero"][i]).mean()) for i, m in enumerate(s.modules)}
        ranked = sorted(s.modules, key=lambda m: (-small[m], -zeros[m]))
        modules = [m for m in ranked if small[m] > 0 or zeros[m] > 0][:MAX_LINE_MODULES]
    modules = list(modules)
    fig = _figure(7.5)
    axes = fig.subplots(3, 1, sharex=True)
    colors = [f"C{i}" for i in range(10)]
    labels = short_names(modules, 48)
    for ax, kind, what in zip(
        axes,
        ("underflow", "subnormal", "zero"),
        (f"lost: cast to 0 in {s.fmt}", f"{s.fmt} subnormal: precision lost", "exactly zero already"),
        strict=True,
    ):
        drew = False
        for i, (m, label) in enumerate(zip(modules, labels, strict=True)):
            row = s.fractions[kind][s.modules.index(m)]
            shown = np.where(row > 0, row, np.nan)
            if np.isfinite(shown).any():
                drew = True
            ax.plot(*s.line(shown), "-o", ms=2.5, lw=1.4, color=colors[i % 10], label=label)
        _mark_skips(ax, s)
        if drew:
            ax.set_yscale("log")
        else:
            ax.set_ylim(0, 1)
            where = "these modules" if modules else "any module"
            ax.text(0.5, 0.5, f"no {kind} in {where}", transform=ax.transAxes, ha="center", color="#555555")
        ax.set_ylabel(f"{kind}\nfraction", fontsize=9)
        ax.set_title(f"{kind.capitalize()} ({what})", loc="left", fontsize=10)
        ax.grid(True, alpha=0.3)
    axes[-1].set_xlabel("step (faint red lines: skipped steps)")
    _step_axis(axes[-1], s)
    if modules:
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=3, fontsize=8)
    fig.suptitle("Fractions of each module's gradient elements, by step", x=0.01, ha="left", fontsize=12)
    return fig


def total_norm(records: Sequence[Mapping[str, Any]] | RunSeries) -> Figure:
    """Unscaled total gradient norm over steps (log y); Inf and NaN steps as markers along the top."""
    s = series_of(records)
    if not len(s):
        return _message_figure("Total gradient norm", "The log has no records.")
    fig = _figure(3.8)
    ax = fig.add_subplot()
    norm = s.total_norm
    finite = np.isfinite(norm) & (norm > 0)
    ax.plot(*s.line(np.where(finite, norm, np.nan)), "-o", ms=2.5, lw=1.4, color="#2ca02c", label="total norm")
    if finite.any():
        ax.set_yscale("log")
    else:
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no finite, nonzero norm in this log", transform=ax.transAxes, ha="center", color="#555")
    trans = blended_transform_factory(ax.transData, ax.transAxes)
    for mask, marker, color, label in (
        (np.isinf(norm), "^", SKIP_COLOR, "Inf"),
        (np.isnan(norm), "X", NAN_COLOR, "NaN"),
    ):
        if mask.any():
            ax.plot(
                s.steps[mask],
                np.full(mask.sum(), 0.96),
                marker,
                color=color,
                ms=8,
                transform=trans,
                label=f"{label} ({mask.sum()} steps)",
            )
    _mark_skips(ax, s)
    ax.set_xlabel("step")
    ax.set_ylabel("total norm (unscaled)")
    bad = int((~np.isfinite(norm)).sum())
    ax.set_title(f"Total gradient norm: {bad} of {len(s)} steps non-finite", loc="left", fontsize=12)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=9)
    _step_axis(ax, s)
    return fig


def memory(records: Sequence[Mapping[str, Any]] | RunSeries) -> Figure:
    """Memory over steps from the records' "hardware" (GiB), with GPU utilisation and temperature below
    when logged; a figure that says "not available" (with the log's hardware note) when there is none."""
    s = series_of(records)
    present = [(k, label, ls) for k, label, ls in HARDWARE_SERIES if k in s.hardware]
    if not present or not len(s):
        return _message_figure("Memory", s.unavailable()["memory"])
    total_note = ""
    if "gpu_mem_total" in s.hardware and len(present) > 1:
        others = max(np.nanmax(s.hardware[k]) for k, _, _ in present if k != "gpu_mem_total")
        total = np.nanmax(s.hardware["gpu_mem_total"])
        if total > 2 * others:  # a line at 80 GiB would flatten every other line: say it instead
            present = [p for p in present if p[0] != "gpu_mem_total"]
            total_note = f", GPU memory total {total / 2**30:.1f} GiB (off the scale)"
    extra = [k for k in ("gpu_util", "gpu_temp") if k in s.hardware]
    fig = _figure(4.2 + (2.2 if extra else 0))
    axes = fig.subplots(2 if extra else 1, 1, sharex=True, height_ratios=[2, 1] if extra else None, squeeze=False)
    ax = axes[0, 0]
    for i, (key, label, ls) in enumerate(present):
        ax.plot(
            *s.line(s.hardware[key] / 2**30),
            ls,
            marker="." if ls == "-" else None,
            ms=3,
            color=f"C{i}",
            lw=1.5,
            label=label,
        )
    ax.set_ylabel("GiB")
    top = max(np.nanmax(s.hardware[k]) for k, _, _ in present) / 2**30
    ax.set_ylim(0, top * 1.3 if top > 0 else 1)  # room for the legend above the lines
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, ncols=3)
    note = f" ({_shorten('; '.join(s.hardware_notes), 70)})" if s.hardware_notes else ""
    ax.set_title(mpl_text(f"Memory by step{total_note}{note}"), loc="left", fontsize=12)
    if extra:
        low = axes[1, 0]
        if "gpu_util" in s.hardware:
            low.plot(*s.line(s.hardware["gpu_util"]), "-", color="C6", label="GPU utilisation (%)")
        if "gpu_temp" in s.hardware:
            low.plot(*s.line(s.hardware["gpu_temp"]), "-", color="C3", label="GPU temperature (°C)")
        low.grid(True, alpha=0.3)
        low.legend(loc="upper left", fontsize=8, ncols=2)
    axes[-1, 0].set_xlabel("step")
    _step_axis(axes[-1, 0], s)
    return fig


# ---------------------------------------------------------------- all at once

PLOTTERS: dict[str, Callable[[RunSeries], Figure]] = {
    "loss_scale": loss_scale,
    "heatmap_latest": heatmap_latest,
    "heatmap_over_time": heatmap_over_time,
    "fractions": fractions,
    "total_norm": total_norm,
    "memory": memory,
}


def save_all(
    records: Sequence[Mapping[str, Any]] | RunSeries, out_dir: str | Path, *, dpi: int = DPI
) -> dict[str, Path]:
    """Writes every figure as ``out_dir/<name>.png`` (names in ``FIGURES``); returns name -> path."""
    s = series_of(records)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    # NaN marks what a log lacks and the figures draw around it: numpy's notes about it are noise here.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN slice", category=RuntimeWarning)
        for name, plot in PLOTTERS.items():
            fig = plot(s)
            path = out / f"{name}.png"
            fig.savefig(path, dpi=dpi, facecolor="white")
            paths[name] = path
    return paths
