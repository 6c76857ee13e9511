"""Figures of a run log: loss scale, exponent heatmaps with the format's bands, fractions, norms, memory.

This module only draws. Every figure reads one analysis object, ``RunSeries.from_records(amp_inspect.read_log(
path))`` (amp_inspect/render/series.py, which also defines the terms: unscaled log2 magnitude, bands), and is returned
as a ``matplotlib.figure.Figure`` made directly (Agg canvas, no pyplot state). ``render_all`` draws them all as
PNG bytes, ``save_all`` writes those. Plotting needs matplotlib, which the core package does not depend on.

Cost: each figure renders in well under a second for logs of thousands of records and tens of modules.

Why over 600 lines: six figures, each a long run of matplotlib calls sharing the style constants and figure
helpers here; the analysis they read is in render/series.py, and splitting the figures apart would only scatter those.
"""

from __future__ import annotations

import io
import itertools
import math
import textwrap
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from matplotlib.transforms import blended_transform_factory

from amp_inspect.core.formats import EXPONENT_BIAS, HIST_BINS, NONFINITE_BIN, ZERO_BIN
from amp_inspect.core.printable import mpl_text, shown_name
from amp_inspect.render.series import MEMORY_KEYS, Bands, RunSeries, scale_shift, series_of, usable_scale
from amp_inspect.scaling.policies import (
    HEADROOM,
    MARGIN,
    NO_DATA,
    NONFINITE_NOT_FROM_SCALE,
    OVERFLOW,
    START,
    is_routine,
    reason_words,
)
from amp_inspect.scaling.timeline import POLICY_TORCH

# RunSeries, Bands and series_of live in amp_inspect/render/series.py (analysis apart from rendering); they stay
# importable from here as they always were.
__all__ = ["FIGURES", "PLOTTERS", "Bands", "RunSeries", "fractions", "heatmap_latest", "heatmap_over_time"]
__all__ += ["loss_scale", "memory", "mpl_text", "save_all", "series_of", "short_name", "short_names", "total_norm"]
__all__ += ["render_all", "unavailable"]

NAME_WIDTH = 34  # characters of a module name in an axis label
MAX_HEATMAP_MODULES = 40
MAX_LINE_MODULES = 6
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
MEMORY_STYLE = {  # key -> (label, line style)
    "rss_bytes": ("process RSS", "-"),
    "torch_allocated": ("torch allocated", "-"),
    "torch_reserved": ("torch reserved", "-"),
    "torch_peak": ("torch peak allocated", ":"),
    "gpu_mem_used": ("GPU memory used", "-"),
    "gpu_mem_total": ("GPU memory total", "--"),
}
HARDWARE_SERIES = tuple((key, *MEMORY_STYLE[key]) for key in MEMORY_KEYS)  # key, label, line style
# The loss-scale policy's decisions on the scale figure, by reason: (marker, colour): the headroom policy's
# reasons have their own; another policy's take the next of OTHER_DECISION_STYLES in the order they appear. The
# words are the policy's (scale_policy's registry, by the name the log records); its routine moves (plain
# headroom moves: most steps) are small dots, the others stand out.
DECISION_STYLE = {
    HEADROOM: (".", "#17becf"),
    START: ("D", "#2ca02c"),
    MARGIN: ("s", "#ff7f0e"),
    OVERFLOW: ("^", "#8c564b"),
    NONFINITE_NOT_FROM_SCALE: ("P", NAN_COLOR),
    NO_DATA: ("o", "#7f7f7f"),
}
OTHER_DECISION_STYLES = (("o", "#9467bd"), ("X", "#e377c2"), ("v", "#bcbd22"), ("*", "#17becf"), ("h", "#7f7f7f"))
FIGURES = ("loss_scale", "heatmap_latest", "heatmap_over_time", "fractions", "total_norm", "memory")


# ---------------------------------------------------------------- text helpers


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
    out = [short_name(shown_name(n), width) for n in names]
    for _ in range(4):
        counts = Counter(out)
        clashes = [i for i, s in enumerate(out) if counts[s] > 1]
        if not clashes:
            break
        width += 12
        for i in clashes:
            out[i] = short_name(shown_name(names[i]), width)
    return [mpl_text(s) for s in out]


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def unavailable(series: RunSeries) -> dict[str, str]:
    """Figure name -> why it has nothing to draw, for the figures that have nothing (else absent)."""
    out = {}
    if not len(series):
        out.update(dict.fromkeys(FIGURES, "The log has no records."))
    if not series.hists:
        message = (
            "No exponent histograms in this log (they are written every hist_every steps; the run may be "
            "shorter than that, or hist_every=0)."
        )
        out.update(heatmap_latest=message, heatmap_over_time=message)
    if not series.modules:
        out["fractions"] = "No per-module statistics in this log."
    if not any(key in series.hardware for key in MEMORY_KEYS):
        note = "; ".join(series.hardware_notes) or 'the records carry no "hardware" fields'
        out["memory"] = f"Memory metrics not available: {note}"
    return out


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
    wrapped = "\n".join(textwrap.wrap(mpl_text(message), 110))
    ax.text(0.5, 0.45, wrapped, ha="center", va="center", fontsize=12, color="#555555")
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
    if s.has_scale:
        _mark_decisions(ax, s)
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
        origin = s.origin(j)  # where the step's NaN/Inf started (evidence/attribution.py), as every surface says it
        who = origin[0] if origin else "no module named"
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
    if s.policy != POLICY_TORCH:
        title += f" (policy={s.policy!r})"
    rate = skipped.size / len(s)
    title += f": {skipped.size} of {len(s)} inspected steps skipped ({rate:.1%})"
    if poisoned.size:
        title += f", {poisoned.size} poisoned"
    ax.set_title(mpl_text(title), loc="left", fontsize=12)
    ax.grid(True, alpha=0.3)
    handles = ax.get_legend_handles_labels()[0]
    if handles:
        ax.legend(loc="lower right", fontsize=8 if len(handles) > 3 else 9, ncols=2 if len(handles) > 3 else 1)
    _step_axis(ax, s)
    return fig


def _mark_decisions(ax: Any, series: RunSeries) -> None:
    """The loss-scale policy's decisions that changed the scale or skipped their step, one marker style per
    reason, at the step the decision was taken and the scale it chose (the next step runs at it)."""
    by_reason: dict[tuple[str, str], list[tuple[int, float]]] = {}  # (policy, reason) -> (step, scale chosen)
    for change in series.scale_changes():
        chosen = usable_scale(change.decision.scale)
        if np.isfinite(chosen):
            by_reason.setdefault((change.decision.policy, change.decision.reason), []).append((change.step, chosen))
    others = itertools.cycle(OTHER_DECISION_STYLES)
    for (policy, reason), points in by_reason.items():
        marker, color = DECISION_STYLE[reason] if reason in DECISION_STYLE else next(others)
        routine = is_routine(policy, reason)
        if routine:
            marker = "."
        steps, scales = zip(*points, strict=True)
        label = mpl_text(f"decision: {reason_words(policy, reason)} ({len(points)})")
        ax.plot(steps, scales, marker, ls="none", color=color, ms=5 if routine else 7, label=label, zorder=4)


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
        return _message_figure("Gradient exponents, latest step", unavailable(s)["heatmap_latest"])
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
    shift = scale_shift(s.scale[j])
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
    shifts = np.array([scale_shift(s.scale[j]) for j in cols])
    frac = np.stack([_hist_fractions(s.hists[j][module]) for j in cols], axis=1)  # [256, C]
    # Re-index every column on the unscaled exponent: row e holds bin e + 127 + shift.
    occupied = [np.flatnonzero(frac[1:NONFINITE_BIN, c] > 0) + 1 for c in range(len(cols))]
    data_lo = min((o[0] - EXPONENT_BIAS - sh for o, sh in zip(occupied, shifts, strict=True) if o.size), default=0)
    data_hi = max((o[-1] - EXPONENT_BIAS - sh + 1 for o, sh in zip(occupied, shifts, strict=True) if o.size), default=0)
    bands = s.bands
    log2_scales = np.array([scale_shift(x) for x in s.scale], dtype=float)
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
    run_lo, run_hi = float(s.steps.min()) - 0.5, float(s.steps.max()) + 0.5
    x_edges[0] = max(x_edges[0], run_lo)
    x_edges[-1] = min(x_edges[-1], run_hi)

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
    # The x axis is the whole run, however few steps have histograms: one column sits at its step, among the
    # run's skips and bands, not alone on an axis one step wide.
    xs = np.append(s.steps[shown].astype(float), run_hi)
    xs[0] = min(xs[0], run_lo)
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
    xlabel = f"step (columns: the {len(cols)} of {len(s.steps)} logged steps with histograms)"
    if far:
        xlabel += "\nband edges off the plot: " + "; ".join(far)
    ax_zero.set_xlabel(xlabel)
    ax_zero.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_zero.set_xlim(run_lo, run_hi)
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
        return _message_figure("Underflow, subnormal and zero fractions", unavailable(s)["fractions"])
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
        ax.set_title(mpl_text(f"{kind.capitalize()} ({what})"), loc="left", fontsize=10)
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
        return _message_figure("Memory", unavailable(s)["memory"])
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


def render_all(records: Sequence[Mapping[str, Any]] | RunSeries, *, dpi: int = DPI) -> dict[str, bytes]:
    """Every figure (names in ``FIGURES``) as PNG bytes, in memory: nothing is written."""
    s = series_of(records)
    pngs = {}
    # NaN marks what a log lacks and the figures draw around it: numpy's notes about it are noise here.
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="All-NaN slice", category=RuntimeWarning)
        for name, plot in PLOTTERS.items():
            buffer = io.BytesIO()
            plot(s).savefig(buffer, format="png", dpi=dpi, facecolor="white")
            pngs[name] = buffer.getvalue()
    return pngs


def save_all(
    records: Sequence[Mapping[str, Any]] | RunSeries, out_dir: str | Path, *, dpi: int = DPI
) -> dict[str, Path]:
    """Writes every figure as ``out_dir/<name>.png`` (names in ``FIGURES``), once all are drawn; returns name ->
    path."""
    pngs = render_all(records, dpi=dpi)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, data in pngs.items():
        paths[name] = out / f"{name}.png"
        paths[name].write_bytes(data)
    return paths
