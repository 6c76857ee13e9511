"""The format-readiness heatmap of a run log's last readiness table: one row per module, one column per recipe,
coloured by the SQNR of the module's worst judged operand (X, W or dY), each cell marked with its verdict and with
the flushed and saturated percentages where they are not nil; and the HTML report's section holding it.

Only draws: the table and its verdicts are readiness/report.py's (``ReadinessReport``). Needs matplotlib (Agg canvas,
no pyplot state), like render/plots.py. Cost: one figure, well under a second for tens of modules.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from amp_inspect.core.printable import html_text, mpl_text, shown_name
from amp_inspect.readiness.report import (
    BORDERLINE,
    JUDGED_OPERANDS,
    NOT_MEASURED,
    NOT_READY,
    READY,
    ReadinessReport,
    from_log,
)

MAX_MODULES = 40  # rows drawn at most (the first ones measured); the text table has them all
SQNR_RANGE = (0.0, 40.0)  # dB: the colour scale (E4M3's best is about 32, E2M1's about 20)
VERDICT_MARKS = {READY: "ready", BORDERLINE: "borderline", NOT_READY: "NOT READY", NOT_MEASURED: "not measured"}
VERDICT_EDGES = {READY: "#1a9850", BORDERLINE: "#fdae61", NOT_READY: "#d73027", NOT_MEASURED: "#999999"}
CAPTION = (
    "One row per module, one column per recipe, at the log's last readiness step. Colour: the SQNR (dB) of the "
    "module's worst judged operand (X, W, dY) under that recipe; the cell says its verdict and, where not nil, the "
    "largest share of its operands' nonzero values that would flush to zero (f) or saturate (s). Thresholds and how "
    "to read it: docs/readiness.md."
)


def _worst(report: ReadinessReport, module: str, r: int) -> tuple[float, float, float]:
    """(lowest SQNR, highest flushed fraction, highest saturated fraction) over the judged operands."""
    ops = [s for op, s in report.modules[module].items() if op in JUDGED_OPERANDS and s.nonzero]
    if not ops:
        return math.nan, 0.0, 0.0
    return (
        min(s.sqnr_db(r) for s in ops),
        max(s.flushed_fraction(r) for s in ops),
        max(s.saturated_fraction(r) for s in ops),
    )


def readiness_heatmap(report: ReadinessReport) -> Figure:
    """The module x recipe heatmap of ``report`` (module docstring)."""
    modules = list(report.modules)[:MAX_MODULES]
    recipes = report.recipes
    sqnr = np.full((len(modules), len(recipes)), np.nan)
    fig = Figure(figsize=(11.0, 1.2 + 0.42 * max(len(modules), 1)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cells = []
    for i, module in enumerate(modules):
        for r, recipe in enumerate(recipes):
            worst, flushed, saturated = _worst(report, module, r)
            sqnr[i, r] = min(worst, SQNR_RANGE[1]) if not math.isnan(worst) else np.nan
            marks = [VERDICT_MARKS[report.verdict(module, recipe).level]]
            marks += [f"f {100 * flushed:.2g}%"] if flushed else []
            marks += [f"s {100 * saturated:.2g}%"] if saturated else []
            cells.append((i, r, worst, " ".join(marks[1:]), report.verdict(module, recipe).level))
    image = ax.imshow(sqnr, aspect="auto", cmap="viridis", vmin=SQNR_RANGE[0], vmax=SQNR_RANGE[1])
    for i, r, worst, marks, level in cells:
        value = "-" if math.isnan(worst) else ("inf" if math.isinf(worst) else f"{worst:.0f} dB")
        text = f"{value} {VERDICT_MARKS[level]}" + (f"\n{marks}" if marks else "")
        colour = "white" if not math.isnan(sqnr[i, r]) and sqnr[i, r] < 25 else "black"
        ax.text(r, i, text, ha="center", va="center", fontsize=6.5, color=colour)
        ax.add_patch(_edge(r, i, VERDICT_EDGES[level]))
    ax.set_xticks(range(len(recipes)), recipes, rotation=20, ha="right", fontsize=8)
    ax.set_yticks(range(len(modules)), [mpl_text(shown_name(m, limit=40)) for m in modules], fontsize=8)
    when = f" (step {report.step})" if report.step is not None else ""
    ax.set_title(f"Format readiness{when}: SQNR of the worst judged operand", fontsize=10)
    fig.colorbar(image, ax=ax, label="SQNR (dB)", fraction=0.03)
    fig.tight_layout()
    return fig


def _edge(x: float, y: float, colour: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.48, y - 0.46), 0.96, 0.92, fill=False, edgecolor=colour, linewidth=1.6)


def html_section(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The HTML report's readiness section for a run log's records (the last readiness table), None when the log
    has none. Every text from the log is HTML-escaped."""
    tables = from_log(records)
    if not tables:
        return None
    report = tables[-1]
    buffer = io.BytesIO()
    readiness_heatmap(report).savefig(buffer, format="png", dpi=100, facecolor="white")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    counts = report.ready_counts()
    ready = ", ".join(f"{r} {counts[r][READY]}/{len(report.modules)}" for r in report.recipes)
    best = report.best_recipe()
    more = len(report.modules) - MAX_MODULES
    note = f" The first {MAX_MODULES} modules are drawn ({more} more in the table)." if more > 0 else ""
    e = html_text
    return (
        '<section id="readiness"><h2>Format readiness: could this run move to FP8, MXFP8, NVFP4?</h2>'
        f'<p class="note">Modules ready per recipe: {e(ready)}. The recipe that keeps the most modules ready: '
        f"<b>{e(str(best))}</b>. The full table: <code>amp-inspect readiness LOG</code>.{e(note)}</p>"
        f'<figure><img src="data:image/png;base64,{data}" alt="format readiness heatmap">'
        f"<figcaption>{e(CAPTION)}</figcaption></figure></section>"
    )
