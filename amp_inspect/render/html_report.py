"""One self-contained HTML page for a run log: the headline numbers, the figures, offenders, advice.

``write_report("run.jsonl", "report.html")`` writes the page and, next to it (or in ``png_dir``), the PNG
of every figure of amp_inspect/render/plots.py, named after the page (``report_loss_scale.png``, ...); the page
embeds the same PNGs as base64 data URIs, so it can be mailed or attached on its own. The page and its figures
are all made (in memory) before any file is written. It loads nothing from elsewhere (no CDN, no script) and
every text that comes from the log (module names, findings, notes) goes through ``printable.html_text``: unprintable
characters (control, bidi overrides) written as escapes, then HTML-escaped.

The page reads the same analysis objects as the rest of the package: ``series.RunSeries`` for the series and
``history.summarize`` for the skip rate, scale events, warnings and advice. Cost: reading the log plus
rendering six figures, about a second for a log of a few thousand records.
"""

from __future__ import annotations

import base64
import math
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from amp_inspect._version import __version__
from amp_inspect.core.printable import html_text
from amp_inspect.diagnosis.history import StepRecord, Summary, summarize
from amp_inspect.readiness.plot import html_section as readiness_section
from amp_inspect.render.plots import FIGURES, render_all, unavailable
from amp_inspect.render.series import RunSeries
from amp_inspect.runlog.log import is_run_log, read_log
from amp_inspect.scaling.timeline import POLICY_TORCH, scale_text, shown_changes
from amp_inspect.updates.plot import html_section as updates_section

MAX_OFFENDER_ROWS = 8
MAX_FINDINGS_PER_MODULE = 3

CAPTIONS = {
    "loss_scale": "Loss scale per inspected step (log2 axis). Red triangles are skipped steps (NaN/Inf gradients); "
    "the numbered ones are listed under the plot with their first offender. A saw-tooth that keeps hitting "
    "the same ceiling means the scale keeps growing into the same overflow. Under policy='headroom' the "
    "scaler's decisions are marked by reason, at the step they were taken and the scale they chose.",
    "heatmap_latest": "One row per module, one column per binade of the unscaled |gradient| at the latest step "
    "with histograms; colour is the fraction of the module's elements (log scale). Shaded: where the format "
    "would underflow to 0 (blue), turn subnormal (orange) or overflow to Inf (red) at that step's loss scale. "
    "Mass left of the blue line is lost; mass right of the red line skips the step. Offender rows are red.",
    "heatmap_over_time": "The same histogram for one module (named in the title) at each step with histograms. "
    "The bands move towards smaller gradients when the loss scale grows and back when it backs off. "
    "Top strip: Inf/NaN; bottom strip: zeros; red ticks: skipped steps.",
    "fractions": "Fractions of the most affected modules' gradient elements that underflow to 0, turn subnormal, "
    "or are exactly zero, per step (log axis; a fraction of 0 is not drawn). Underflow and subnormal fractions "
    "rise when the loss scale backs off.",
    "total_norm": "Unscaled total gradient norm per step (log axis); steps with an Inf or NaN norm are marked "
    "along the top. A norm that climbs before the skips points at growing activations, not the scaler.",
    "memory": "Process and torch memory per step from the log's hardware fields (GiB); GPU utilisation and "
    "temperature below when recorded.",
}
# A run without a loss scale has no saw-tooth to read: its plot only marks the steps (or says there are none).
NO_SCALE_CAPTION = "This run has no loss scale (no enabled GradScaler)."
NO_SCALE_MARKS = (
    " The plot marks its skipped (red triangles) and poisoned (dark crosses: NaN/Inf that no scaler skipped) steps "
    "on one line."
)
TITLES = {
    "loss_scale": "Loss scale and skipped steps",
    "heatmap_latest": "Gradient exponents by module, latest histogram",
    "heatmap_over_time": "Gradient exponents over time",
    "fractions": "Underflow, subnormal and zero fractions",
    "total_norm": "Total gradient norm",
    "memory": "Memory",
}

CSS = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; background: #fff; margin: 0; }
main { max-width: 1140px; margin: 0 auto; padding: 16px 20px 40px; }
h1 { font-size: 24px; margin: 8px 0 4px; }
h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
.source { color: #666; margin: 0 0 12px; word-break: break-all; }
.facts { display: flex; flex-wrap: wrap; gap: 10px; margin: 0; padding: 0; list-style: none; }
.facts li { background: #f3f6fa; border: 1px solid #dde4ee; border-radius: 6px; padding: 6px 12px; }
.facts b { display: block; font-size: 20px; }
.facts .bad b { color: #b2182b; }
.warnings li { color: #b2182b; }
.advice li, .warnings li { margin: 4px 0; }
table.offenders { border-collapse: collapse; width: 100%; font-size: 14px; }
table.offenders th, table.offenders td { border: 1px solid #ddd; padding: 4px 8px; vertical-align: top;
  text-align: left; }
table.offenders th { background: #f3f6fa; }
table.offenders td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.module { font-family: ui-monospace, monospace; word-break: break-all; }
figure { margin: 12px 0 24px; }
figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #444; font-size: 14px; margin-top: 4px; }
.note { color: #555; }
footer { color: #888; font-size: 12px; margin-top: 32px; }
"""


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class OffenderRow:
    """One module behind skipped steps: how many it took part in, when, and what the activation hooks saw."""

    module: str
    skips: int
    first_step: int
    last_step: int
    findings: list[str] = field(default_factory=list)
    more_findings: int = 0


def offender_rows(
    series: RunSeries, limit: int = MAX_OFFENDER_ROWS, steps: np.ndarray | None = None
) -> list[OffenderRow]:
    """Offenders by skipped steps with NaN/Inf in their gradients (most first: a count, not blame); each with the
    distinct ``first_nonfinite`` findings of those steps (the finding names the first module whose forward output
    went non-finite, which may be a parent or a neighbour of the gradient offender). ``steps``: another bool mask
    of records (the poisoned ones)."""
    rows: dict[str, OffenderRow] = {}
    for j in np.flatnonzero(series.skipped if steps is None else steps):
        step = int(series.steps[j])
        finding = series.first_nonfinite[j]
        for module in series.offenders[j]:
            row = rows.get(module)
            if row is None:
                row = rows[module] = OffenderRow(module, 0, step, step)
            row.skips += 1
            row.first_step, row.last_step = min(row.first_step, step), max(row.last_step, step)
            if finding and finding not in row.findings:
                if len(row.findings) < MAX_FINDINGS_PER_MODULE:
                    row.findings.append(finding)
                else:
                    row.more_findings += 1
    return sorted(rows.values(), key=lambda r: (-r.skips, r.first_step))[:limit]


def _summary(records: Sequence[dict]) -> tuple[Summary | None, str | None]:
    """history.summarize of the log, or None and the reason when it cannot be made."""
    try:
        return summarize([StepRecord.from_log_record(r) for r in records]), None
    except (KeyError, TypeError, ValueError) as err:  # a log the summary does not cover, e.g. no scale at all
        return None, f"{type(err).__name__}: {err}"


def _facts(series: RunSeries, summary: Summary | None) -> list[tuple[str, str, bool]]:
    """(label, value, is_bad) for the header."""
    n = len(series)
    if not n:
        return [("run length", "no records", True)]
    steps = f"{n} inspected steps"
    if n > 1:
        steps += f" ({series.steps[0]}–{series.steps[-1]})"
    if series.times is not None:
        finite = series.times[np.isfinite(series.times)]
        if finite.size > 1:
            steps += f", {_duration(float(finite.max() - finite.min()))}"
    if series.restarts:
        steps += f"; the step number went back {series.restarts} time(s): records of a resumed run?"
    skipped = int(series.skipped.sum())
    facts = [("run length", steps, False), ("skipped steps", f"{skipped} ({skipped / n:.1%})", skipped > 0)]
    poisoned = int(series.poisoned.sum())
    if poisoned:  # NaN/Inf the optimizer applied: no enabled GradScaler skipped those steps
        facts.append(("poisoned steps (NaN/Inf applied, no GradScaler)", f"{poisoned} ({poisoned / n:.1%})", True))
    final = series.scale[-1]
    facts.append(("final loss scale", scale_text(final) if math.isfinite(final) else "none (no GradScaler)", False))
    if series.has_scale:
        lo, hi = np.nanmin(series.scale), np.nanmax(series.scale)
        facts.append(("loss scale range", f"{scale_text(lo)} – {scale_text(hi)}", False))
    if series.policy != POLICY_TORCH:  # the scaler's own decisions set the scale (listed below)
        facts.append(("loss-scale policy", series.policy, False))
    if summary is not None and summary.events:
        growth = sum(e.kind == "growth" for e in summary.events)
        facts.append(("scale events", f"{growth} growth, {len(summary.events) - growth} backoff", False))
    facts.append(("format judged", series.fmt, False))
    return facts


def _decisions_section(summary: Summary) -> list[str]:
    """The loss-scale policy's decisions that changed the scale or skipped a step, as a table."""
    shown = shown_changes(summary.decisions)
    out = [
        f'<section id="decisions"><h2>Loss-scale decisions (policy {html_text(repr(summary.policy))})</h2>',
        '<p class="note">Each step where the scaler changed the scale or skipped the step: the scale the step ran '
        "at, the scale chosen for the next step, why, and the kind of skip. The same decisions are marked on the "
        "loss-scale figure.</p>",
        '<table class="offenders"><thead><tr><th>step</th><th>scale</th><th>next scale</th><th>why</th>',
        "<th>skipped</th><th>modules with NaN/Inf</th></tr></thead><tbody>",
    ]
    for c in shown:
        d = c.decision
        out.append(
            f'<tr><td class="num">{c.step}</td><td class="num">{html_text(scale_text(d.previous))}</td>'
            f'<td class="num">{html_text(scale_text(d.scale))}</td><td>{html_text(c.reason_text)}</td>'
            f"<td>{html_text(c.skip_text or '-')}</td>"
            f'<td class="module">{html_text(", ".join(d.offenders[:3]))}</td></tr>'
        )
    out.append("</tbody></table>")
    if len(shown) < len(summary.decisions):
        more = len(summary.decisions) - len(shown)
        out.append(f'<p class="note">… and {more} more decisions (plain headroom moves are left out first).</p>')
    out.append("</section>")
    return out


def _hardware_text(series: RunSeries) -> str:
    if series.hardware_notes:
        return "; ".join(series.hardware_notes)
    if series.hardware:
        return "recorded: " + ", ".join(sorted(series.hardware))
    return "no hardware metrics in this log"


def render_html(
    series: RunSeries,
    summary: Summary | None,
    pngs: dict[str, bytes],
    *,
    source: str,
    summary_error: str | None = None,
    readiness: str | None = None,
    updates: str | None = None,
) -> str:
    """The page as a string: ``pngs`` maps figure names to PNG bytes (embedded as data URIs); ``readiness`` the
    format-readiness section (readiness_plot.html_section), when the log has one; ``updates`` the update-ratio section
    (update_plot.html_section), beside the gradient heatmaps."""
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>amp_inspect report: {html_text(Path(source).name)}</title>",
        f"<style>{CSS}</style></head><body><main>",
        "<header><h1>amp_inspect run report</h1>",
        f'<p class="source">log: {html_text(source)}</p><ul class="facts">',
    ]
    for label, value, bad in _facts(series, summary):
        attribute = ' class="bad"' if bad else ""
        out.append(f"<li{attribute}>{html_text(label)}<b>{html_text(value)}</b></li>")
    out.append("</ul></header>")

    out.append("<section><h2>Findings and advice</h2>")
    if summary is None:
        out.append(f'<p class="note">The run summary could not be made from this log ({html_text(summary_error)}).</p>')
    else:
        if summary.warnings:
            warnings = "".join(f"<li>{html_text(w)}</li>" for w in summary.warnings)
            out.append(f'<ul class="warnings">{warnings}</ul>')
        if summary.advice:
            out.append('<ul class="advice">' + "".join(f"<li>{html_text(a)}</li>" for a in summary.advice) + "</ul>")
        if not summary.warnings and not summary.advice:
            if summary.scaler:
                out.append('<p class="note">No warnings and no advice: the loss scale looks healthy for this run.</p>')
            else:  # no loss scale to call healthy (a bf16 or fp32 run without a GradScaler)
                out.append(
                    '<p class="note">No warnings and no advice: no NaN/Inf gradients and no gradient spikes in this '
                    "run (no loss scaler).</p>"
                )
    out.append("</section>")

    # The activation hooks' findings come first: once NaN spreads through the backward pass every module's
    # gradient is an offender, and the first producer is the answer a reader wants. Then where each skipped step's
    # NaN/Inf started (attribution.blame: the same ranking as the summary, the CLI and the plots).
    producers = summary.first_nonfinite if summary is not None else Counter()
    if producers:
        out.append("<section><h2>First non-finite producers (activation hooks, armed after skipped steps)</h2><ul>")
        for where, count in producers.most_common():
            out.append(f"<li>{html_text(where)} &mdash; on {count} inspected step{'s' if count > 1 else ''}</li>")
        out.append("</ul></section>")
    # The summary's blame where there is one: it leaves out the steps whose NaN/Inf followed from poisoned weights
    # (diagnosis/incident.py), which the warnings above tell.
    started = summary.blame if summary is not None else series.blame()
    if started.origins:
        out.append("<section><h2>Where the NaN/Inf of skipped steps started</h2>")
        out.append(f'<p class="note">{html_text(started.describe())}.</p>')
        out.append('<table class="offenders"><thead><tr><th>module</th><th>skipped steps it started in</th>')
        out.append("<th>evidence</th></tr></thead><tbody>")
        for module, count in started.ranked(MAX_OFFENDER_ROWS):
            out.append(
                f'<tr><td class="module">{html_text(module)}</td><td class="num">{count}</td>'
                f"<td>{html_text(started.evidence[module])}</td></tr>"
            )
        out.append("</tbody></table></section>")
    out.append("<section><h2>Offenders: modules with NaN/Inf gradients on skipped steps</h2>")
    rows = offender_rows(series)
    if rows:
        out.append('<table class="offenders"><thead><tr><th>module</th>')
        out.append("<th>skipped steps with NaN/Inf in this module&#39;s gradients</th>")
        out.append("<th>first step</th><th>last step</th></tr></thead><tbody>")
        for r in rows:
            out.append(
                f'<tr><td class="module">{html_text(r.module)}</td><td class="num">{r.skips}</td>'
                f'<td class="num">{r.first_step}</td><td class="num">{r.last_step}</td></tr>'
            )
        out.append("</tbody></table>")
        total = len(series.offender_counts())
        if total > len(rows):
            out.append(f'<p class="note">… and {total - len(rows)} more modules.</p>')
    else:
        out.append('<p class="note">No skipped step had a module with NaN/Inf gradients.</p>')
    out.append("</section>")
    poisoned = offender_rows(series, steps=series.poisoned)
    if poisoned:  # no enabled GradScaler: these NaN/Inf went into the weights
        out.append("<section><h2>Poisoned steps: modules whose NaN/Inf gradients the optimizer applied ")
        out.append("(no enabled GradScaler skipped them)</h2>")
        out.append('<table class="offenders"><thead><tr><th>module</th><th>poisoned steps</th>')
        out.append("<th>first step</th><th>last step</th></tr></thead><tbody>")
        for r in poisoned:
            out.append(
                f'<tr><td class="module">{html_text(r.module)}</td><td class="num">{r.skips}</td>'
                f'<td class="num">{r.first_step}</td><td class="num">{r.last_step}</td></tr>'
            )
        out.append("</tbody></table></section>")
    if summary is not None and summary.decisions:  # policy="headroom": what set the scale, step by step
        out += _decisions_section(summary)
    if summary is not None and summary.ranks:  # distributed runs: where the NaN/Inf was made
        heading = summary.ranks_heading
        out.append(f"<section><h2>{html_text(heading[0].upper() + heading[1:])}</h2><ul>")
        for rank, count in summary.ranks.most_common():
            out.append(f"<li>rank {rank} &mdash; on {count} skipped step{'s' if count > 1 else ''}</li>")
        out.append("</ul></section>")

    missing = unavailable(series)
    if len(series) and not series.has_scale:
        marked = series.skipped.any() or series.poisoned.any()  # else the plot only says there is nothing
        missing.setdefault("loss_scale", NO_SCALE_CAPTION + (NO_SCALE_MARKS if marked else ""))
    for name in FIGURES:
        if name not in pngs:
            continue
        data = base64.b64encode(pngs[name]).decode("ascii")
        caption = missing.get(name, CAPTIONS[name])
        out.append(
            f'<section id="{name}"><h2>{html_text(TITLES[name])}</h2><figure>'
            f'<img src="data:image/png;base64,{data}" alt="{html_text(TITLES[name])}">'
            f"<figcaption>{html_text(caption)}</figcaption></figure></section>"
        )
        if name == "heatmap_over_time" and updates is not None:
            out.append(updates)
            updates = None
    if updates is not None:  # no heatmap to stand beside
        out.append(updates)

    if readiness is not None:
        out.append(readiness)
    out.append(f'<section><h2>Hardware</h2><p class="note">{html_text(_hardware_text(series))}</p></section>')
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    out.append(f"<footer>amp_inspect {html_text(__version__)}, {stamp}</footer></main></body></html>")
    return "\n".join(out) + "\n"


def figure_path(out_html: str | os.PathLike[str], name: str, png_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where ``write_report`` writes figure ``name`` of the page ``out_html``: named after the page
    (``report.html`` -> ``report_loss_scale.png``), so the figures of two reports in one folder never meet."""
    out_html = Path(out_html)
    folder = Path(png_dir) if png_dir is not None else out_html.parent
    return folder / f"{out_html.stem}_{name}.png"


def output_paths(out_html: str | os.PathLike[str], png_dir: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every file ``write_report`` writes: the page, then one PNG per figure (``figure_path``)."""
    return [Path(out_html), *(figure_path(out_html, name, png_dir) for name in FIGURES)]


def check_outputs(log_path: str | os.PathLike[str], targets: Sequence[Path], *, force: bool = False) -> None:
    """ValueError if a target is the run log or any run log (never overwritten, not even with ``force``);
    FileExistsError if a target exists and ``force`` is off. Checked before anything is written."""
    log_path = Path(log_path)
    existing = [t for t in targets if t.exists()]
    for target in existing:
        if target.is_dir():
            raise ValueError(f"{target} is a directory; give a file name for the report")
        if (log_path.exists() and target.samefile(log_path)) or is_run_log(target):
            raise ValueError(f"refusing to overwrite the run log {target} with report output; choose another name")
    if existing and not force:
        names = ", ".join(str(t) for t in existing[:3])
        names += f" and {len(existing) - 3} more" if len(existing) > 3 else ""
        page = targets[0]
        raise FileExistsError(
            f"{names} already exist{'s' if len(existing) == 1 else ''}; overwrite with --force (force=True), "
            f"or give the report another name, e.g. -o {page.with_name(page.stem + '-2' + page.suffix)} (its figures "
            "are named after it)"
        )


def write_report(
    log_path: str | os.PathLike[str],
    out_html: str | os.PathLike[str],
    *,
    png_dir: str | os.PathLike[str] | None = None,
    force: bool = False,
) -> Path:
    """Reads the run log, writes the figures as PNG into ``png_dir`` (default: the HTML's folder), each named after
    the page (``figure_path``: ``report.html`` -> ``report_loss_scale.png``), and the self-contained page to
    ``out_html``; returns the page's path.

    Existing outputs are overwritten only with ``force=True`` (FileExistsError otherwise), and only the page and
    its own figures; a run log is never overwritten (ValueError), so ``-o run.jsonl`` cannot destroy the run. Both
    are checked before writing. Everything the page needs is made before anything is written: a log the report
    cannot be made of leaves no file behind."""
    log_path, out_html = Path(log_path), Path(out_html)
    targets = output_paths(out_html, png_dir)
    records = read_log(log_path)  # first: a missing or unreadable log is the error to report, not the outputs
    check_outputs(log_path, targets, force=force)
    series = RunSeries.from_records(records)
    summary, error = _summary(records)
    pngs = render_all(series)
    page = render_html(
        series,
        summary,
        pngs,
        source=str(log_path),
        summary_error=error,
        readiness=readiness_section(records),
        updates=updates_section(records),
    )
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
    for name, path in zip(FIGURES, targets[1:], strict=True):
        path.write_bytes(pngs[name])
    out_html.write_text(page, encoding="utf-8")
    return out_html
