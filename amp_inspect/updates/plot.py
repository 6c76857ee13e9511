"""The update-to-weight ratio of each module over the measured steps of a run log (``update_every``), and the HTML
report's section holding it, beside the gradient heatmaps.

Only draws: the statistics and the verdicts are updates/report.py's. Needs matplotlib (Agg canvas, no pyplot state),
like render/plots.py. Cost: one figure.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable, Mapping
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from amp_inspect.core.printable import html_text, mpl_text, shown_name
from amp_inspect.updates.report import RATIO_HEALTHY, RATIO_HIGH, ROW_HEADERS, UpdateStats, from_log, overview

MAX_LINES = 12  # modules drawn at most: those whose lost fraction is highest, then the rest in order
CAPTION = (
    "The update-to-weight ratio ||dW|| / ||W|| of each module at each measured optimizer step (log scale), with the "
    f"commonly quoted healthy {RATIO_HEALTHY:g} and the {RATIO_HIGH:g} above which the summary warns; a ratio of 0 "
    "(every update rounded away, or no step) is drawn at the bottom edge. The legend gives each module's share of "
    "updates lost over the run. Thresholds: docs/usage.md, what the optimizer did."
)


def update_ratio_figure(updates: list[UpdateStats]) -> Figure:
    """One line per module (at most MAX_LINES): its update ratio at each measured step."""
    measured = [u for u in updates if u.by_module and not u.skipped]
    lost: dict[str, list[int]] = {}
    for u in measured:
        for m, r in u.by_module.items():
            pair = lost.setdefault(m, [0, 0])
            pair[0] += r["lost"]
            pair[1] += r["numel_with_grad"]
    share = {m: (lo / n if n else 0.0) for m, (lo, n) in lost.items()}
    modules = sorted(share, key=lambda m: -share[m])[:MAX_LINES]
    positive = [r["update_ratio"] for u in measured for r in u.by_module.values() if r["update_ratio"] > 0]
    floor = min(min(positive, default=RATIO_HEALTHY), RATIO_HEALTHY) / 10
    fig = Figure(figsize=(11.0, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for m in modules:
        steps, ratios = [], []
        for u in measured:
            r = u.by_module.get(m)
            if r is not None and not math.isnan(r["update_ratio"]):
                steps.append(u.step)
                ratios.append(max(r["update_ratio"], floor))
        ax.plot(
            steps, ratios, marker="o", markersize=3, label=mpl_text(f"{shown_name(m, limit=40)} ({share[m]:.0%} lost)")
        )
    ax.axhline(RATIO_HEALTHY, color="#1a9850", linestyle="--", linewidth=1)
    ax.axhline(RATIO_HIGH, color="#d73027", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    ax.set_xlabel("step")
    ax.set_ylabel("||dW|| / ||W||")
    ax.set_title("Update-to-weight ratio per module")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig


def html_section(records: Iterable[Mapping[str, Any]]) -> str | None:
    """The HTML report's section for a run log's records, None when no record carries an update."""
    updates = from_log(records)
    if not any(u.by_module for u in updates):
        return None
    buffer = io.BytesIO()
    update_ratio_figure(updates).savefig(buffer, format="png", dpi=100, facecolor="white")
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    e = html_text
    return (
        '<section id="updates"><h2>What the optimizer did: update-to-weight ratio per module</h2>'
        f'<figure><img src="data:image/png;base64,{data}" alt="update ratio per module over time">'
        f"<figcaption>{e(CAPTION)}</figcaption></figure>{_module_table(updates)}</section>"
    )


def _module_table(updates: list[UpdateStats]) -> str:
    """The summary's table (update_report.UpdateOverview: every module, worst first) under its headline."""
    seen = overview(updates)
    if seen is None:
        return ""
    e = html_text
    head = "".join(f"<th>{e(h)}</th>" for h in ROW_HEADERS)
    body = "".join(
        f'<tr><td class="module">{e(shown_name(row[0]))}</td>'
        + "".join(f'<td class="num">{e(cell)}</td>' for cell in row[1:])
        + "</tr>"
        for row in seen.rows()
    )
    return (
        f"<p>{e(seen.headline())}</p>"
        f'<table class="offenders"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    )
