"""Readable terminal output for the demo and ``amp-inspect summary``: rich tables sized to the terminal when
rich is installed (``pip install amp_inspect[report]``), plain fixed-width text otherwise. Everything here
reads host values, so call it when you want to look, not every step.

Names come from users' models and logs, so nothing here is rich markup: every title and cell is a literal
``Text`` (a module called ``[/bold]`` or ``[red]x[/red]`` prints as it is named), and every cell goes through
``printable.shown_name`` (terminal escapes, newlines and bidi overrides print escaped, huge names cut)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence
from typing import Any

from amp_inspect.core.printable import shown_name
from amp_inspect.core.table import fixed_width
from amp_inspect.diagnosis.history import Summary
from amp_inspect.evidence.attribution import count, modules_in_trouble
from amp_inspect.scaling.timeline import scale_text, shown_changes
from amp_inspect.updates.report import ROW_HEADERS as UPDATE_HEADERS

try:  # optional: the core install stays small
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    HAVE_RICH = True
except ImportError:  # pragma: no cover - exercised where rich is absent
    HAVE_RICH = False

MAX_MODULE_ROWS = 12


def _fmt(x: Any) -> str:
    if x is None:
        return "unknown"
    if isinstance(x, float):
        if math.isnan(x):
            return "unknown"  # a module's amax / grad norm with nothing finite to measure (gradients/step_report.py)
        if math.isinf(x):
            return str(x)
        return f"{x:.3g}"
    return str(x)


def _plain_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    return "\n".join([title, *fixed_width(headers, [[shown_name(_fmt(c)) for c in r] for r in rows])])


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A table with the first column left-aligned and the rest right-aligned, fitted to the terminal."""
    if not HAVE_RICH:
        print(_plain_table(title, headers, rows))
        return
    table = Table(title=Text(title), title_justify="left", expand=False)
    for i, h in enumerate(headers):
        table.add_column(Text(h), justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        table.add_row(*(Text(shown_name(_fmt(c))) for c in r))
    Console(width=shutil.get_terminal_size((120, 40)).columns).print(table)


def module_rows(modules: dict[str, dict[str, Any]], limit: int = MAX_MODULE_ROWS) -> list[list[Any]]:
    """Rows for the modules in trouble (NaN/Inf first, then overflow, underflow, subnormal), worst first."""
    rows = []
    for name in modules_in_trouble(modules)[:limit]:
        m = modules[name]
        numel = max(count(m, "numel"), 1)
        share = {k: f"{count(m, k) / numel:.2%}" for k in ("underflow", "subnormal", "zero")}
        bad = count(m, "nan") + count(m, "posinf") + count(m, "neginf")
        rows.append(
            [name, bad, count(m, "overflow"), share["underflow"], share["subnormal"], share["zero"]]
            + [_number(m.get("amax")), _number(m.get("grad_norm"))]
        )
    return rows


def _number(value: Any) -> float | None:
    """A log's value as a float, None where it is missing or not a number (shown as unknown)."""
    return float(value) if isinstance(value, (int, float)) else None


MODULE_HEADERS = ["module", "NaN/Inf", "overflow", "underflow", "subnormal", "zero", "max |g|", "grad norm"]


def print_summary(summary: Summary, last_record: dict[str, Any] | None = None) -> None:
    """The run's summary: rates, scale events, offenders, warnings, advice, and the last step's modules."""
    print(str(summary))
    if summary.blame.origins:
        print_table(
            "where the NaN/Inf of skipped steps started (see docs/usage.md, how blame is decided)",
            ["module", "skipped steps it started in", "evidence"],
            [[m, n, summary.blame.evidence[m]] for m, n in summary.blame.ranked(MAX_MODULE_ROWS)],
        )
    if summary.offenders:
        print_table(
            "modules with NaN/Inf gradients on skipped steps (started there or received it)",
            ["module", "skipped steps with NaN/Inf in this module's gradients"],
            [[m, n] for m, n in summary.offenders.most_common(MAX_MODULE_ROWS)],
        )
    if summary.poisoned_blame.origins and not summary.blame.origins:
        print_table(
            "where the NaN/Inf of poisoned steps started (see docs/usage.md, how blame is decided)",
            ["module", "poisoned steps it started in", "evidence"],
            [[m, n, summary.poisoned_blame.evidence[m]] for m, n in summary.poisoned_blame.ranked(MAX_MODULE_ROWS)],
        )
    if summary.poisoned_offenders:
        # Counts, not blame: every module upstream of the source holds the NaN too (evidence/attribution.py).
        print_table(
            "modules with NaN/Inf gradients on poisoned steps (started there or received it; the optimizer applied "
            "them: no enabled GradScaler)",
            ["module", "poisoned steps with NaN/Inf in this module's gradients"],
            [[m, n] for m, n in summary.poisoned_offenders.most_common(MAX_MODULE_ROWS)],
        )
    if summary.decisions:
        shown = shown_changes(summary.decisions)
        more = len(summary.decisions) - len(shown)
        print_table(
            f"loss-scale decisions (policy '{shown_name(summary.policy)}'): steps where the scale changed or the step "
            "was skipped" + (f"; {len(shown)} of {len(summary.decisions)} shown" if more else ""),
            ["step", "scale", "next scale", "why", "skipped"],
            [
                [
                    c.step,
                    scale_text(c.decision.previous),
                    scale_text(c.decision.scale),
                    c.reason_text,
                    c.skip_text or "-",
                ]
                for c in shown
            ],
        )
    updates = summary.update_overview
    if updates is not None:
        more = len(updates.merged.by_module) - MAX_MODULE_ROWS
        print_table(
            f"what the optimizer did per module over {updates.steps_text}, worst first"
            + (f" ({MAX_MODULE_ROWS} of {MAX_MODULE_ROWS + more}; all: amp-inspect updates LOG)" if more > 0 else ""),
            UPDATE_HEADERS,
            updates.rows(MAX_MODULE_ROWS),
        )
    if summary.ranks:
        ranks = [[r, n] for r, n in summary.ranks.most_common()]
        print_table(summary.ranks_heading, ["rank", "skipped steps"], ranks)
    if last_record and last_record.get("modules"):
        fmt = shown_name((last_record.get("formats") or ["fp16"])[0])
        rows = module_rows(last_record["modules"])
        if rows:
            print_table(
                f"last inspected step ({last_record['step']}): modules in trouble ({fmt})", MODULE_HEADERS, rows
            )
