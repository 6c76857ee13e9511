"""The HTML report and its figures, from a synthetic run log: escaping, embedded PNGs, edge logs, and a
headless Chromium rendering of the page checked from its screenshot.

``make_log`` writes the log a GradScaler run would leave: per-module gradients drawn as log-normal
magnitudes, judged at the loss scale against fp16's exact thresholds, a scaler that grows and backs off,
skips caused by a module named ``<script>alert(1)</script>`` (overflow) and one named ``loss & aux head``
(NaN), histograms every 10 steps and hardware fields.
"""

from __future__ import annotations

import base64
import html
import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="the HTML report's figures need matplotlib")


import pytest

from amp_inspect.diagnosis.history import StepRecord, summarize
from amp_inspect.render import plots  # noqa: E402
from amp_inspect.render.html_report import write_report  # noqa: E402
from amp_inspect.runlog.log import RunLog, read_log, sparse_hist  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SCRIPT_NAME = "<script>alert(1)</script>"
AMP_NAME = "loss & aux head"
LONG_NAME = "model.encoder.layers.11.self_attention.query_key_value.lora_adapter.weight"
FP16_OVERFLOW = math.log2(65520.0)  # judged |v| from here casts to Inf
FP16_NORMAL = math.log2(2.0**-14 * (1 - 2.0**-11))  # from here a cast is normal
FP16_ZERO = -25.0  # |v| <= 2^-25 casts to 0
INF_FROM = 17.0  # synthetic: judged values this large are Inf already (the fp16 backward overflowed)
NAN_STEPS = (41, 42)
CHROMIUM_TIMEOUT_S = 60

# name: (centre of unscaled log2 |grad|, spread in binades, fraction of exact zeros, numel)
MODULES: dict[str, tuple[float, float, float, int]] = {
    "wte": (-14.0, 2.0, 0.3, 20000),
    "blocks.0.attn.qkv": (-9.0, 2.0, 0.0, 20000),
    "blocks.1.mlp.out": (-27.0, 3.5, 0.0, 20000),  # damped: subnormal, some underflow
    SCRIPT_NAME: (-3.0, 1.0, 0.0, 20000),  # amplified logits: overflows at high scales
    AMP_NAME: (-8.0, 1.5, 0.05, 5000),
    LONG_NAME: (-12.0, 2.0, 0.0, 8000),
}


def _module_step(rng: np.random.Generator, spec: tuple[float, float, float, int], log2_scale: float, nan: bool):
    """The module record and 256-bin judged histogram of one step."""
    centre, spread, zero_frac, numel = spec
    zeros = int(round(zero_frac * numel))
    x = rng.normal(centre + log2_scale, spread, numel - zeros)  # judged log2 |v|
    nans = 3 if nan else 0
    x = x[nans:]
    posinf = int((x >= INF_FROM).sum())
    finite = x[x < INF_FROM]
    hist = np.zeros(256, dtype=np.int64)
    hist[0] += zeros
    hist[255] += posinf + nans
    np.add.at(hist, np.clip(np.floor(finite).astype(int) + 127, 0, 254), 1)
    underflow = int((finite <= FP16_ZERO).sum())
    subnormal = int(((finite > FP16_ZERO) & (finite < FP16_NORMAL)).sum())
    overflow = int((finite >= FP16_OVERFLOW).sum())
    scale = 2.0**log2_scale
    values = 2.0**finite
    record = {
        "numel": numel,
        "nan": nans,
        "posinf": posinf,
        "neginf": 0,
        "zero": zeros,
        "overflow": overflow,
        "subnormal": subnormal,
        "underflow": underflow,
        "amax": float(values.max() / scale) if values.size else 0.0,
        "grad_norm": math.nan if nan else (math.inf if posinf else float(np.sqrt((values**2).sum())) / scale),
    }
    return record, hist, float((values**2).sum()), finite


def make_log(
    path: Path,
    steps: int = 60,
    *,
    hist_every: int = 10,
    with_scale: bool = True,
    with_hardware: bool = True,
    seed: int = 0,
) -> Path:
    """Writes a synthetic run log (see the module docstring) and returns its path."""
    rng = np.random.default_rng(seed)
    log2_scale, tracker, growth_interval = 15, 0, 5
    with RunLog(path, hist_every=hist_every) as log:
        for step in range(steps):
            used = log2_scale if with_scale else 0
            modules, hists, sumsq, extremes = {}, {}, 0.0, []
            for name, spec in MODULES.items():
                nan = name == AMP_NAME and step in NAN_STEPS
                modules[name], hists[name], sq, finite = _module_step(rng, spec, used, nan)
                sumsq += sq
                if finite.size:
                    extremes += [finite.min(), finite.max()]
            bad = {n: m["nan"] + m["posinf"] for n, m in modules.items() if m["nan"] + m["posinf"]}
            offenders = sorted(bad, key=lambda n: -bad[n])
            any_nan = any(m["nan"] for m in modules.values())
            norm = math.nan if any_nan else (math.inf if offenders else math.sqrt(sumsq) / 2.0**used)
            up = math.floor(FP16_OVERFLOW - max(extremes))
            down = math.floor(min(extremes) - FP16_ZERO)
            record: dict[str, Any] = {
                "step": step,
                "scale": 2.0**used if with_scale else None,
                "skipped": bool(offenders),
                "total_norm": norm,
                "offenders": offenders,
                "headroom": {"up": up, "down": down},
                "recommended_scale": 2.0 ** (used + min((up - down) // 2, up)),
                "formats": ["fp16", "bf16"],
                "modules": modules,
            }
            if SCRIPT_NAME in offenders and step % 3 == 0:
                record["first_nonfinite"] = f"{SCRIPT_NAME}: forward output overflowed fp16, amax 9.1e+04, step {step}"
            if step in NAN_STEPS:
                record["first_nonfinite"] = f"{AMP_NAME}: forward output is NaN, step {step}"
            if log.wants_hist(step):
                record["hist"] = {name: sparse_hist(h) for name, h in hists.items()}
            if with_hardware:
                gib = 2.0**30
                record["hardware"] = {
                    "rss_bytes": 3.1 * gib + step * 5e6,
                    "torch_allocated": (1.2 + 0.3 * (step % 7) / 7) * gib,
                    "torch_reserved": 2.0 * gib,
                    "torch_peak": 1.6 * gib,
                    "gpu_mem_used": None if step < 3 else 4.5 * gib,
                    "gpu_mem_total": 80 * gib,
                    "gpu_util": 60 + 30 * math.sin(step / 5),
                    "gpu_temp": 55 + step / 6,
                }
            else:
                record["hardware"] = {"rss_bytes": None}
                record["hardware_note"] = "GPU metrics not available: no NVML <b>"
            log.write(record)
            if with_scale:  # GradScaler's update
                if offenders:
                    log2_scale, tracker = log2_scale - 1, 0
                else:
                    tracker += 1
                    if tracker == growth_interval:
                        log2_scale, tracker = log2_scale + 1, 0
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict], Path]:
    """(HTML path, records, PNG folder) of the 60-step synthetic run."""
    root = tmp_path_factory.mktemp("report")
    log = make_log(root / "run.jsonl")
    out = write_report(log, root / "out" / "report.html")
    return out, read_log(log), root / "out"


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC, "not a PNG"
    assert data[12:16] == b"IHDR"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_synthetic_log_has_the_story(report: tuple[Path, list[dict], Path]) -> None:
    _, records, _ = report
    assert len(records) == 60
    scales = [r["scale"] for r in records]
    assert max(scales) > scales[0] and min(scales) < scales[0], "the scale should grow and back off"
    offenders = {m for r in records for m in r["offenders"]}
    assert {SCRIPT_NAME, AMP_NAME} <= offenders
    assert sum("hist" in r for r in records) == 6


def test_report_writes_html_and_pngs(report: tuple[Path, list[dict], Path]) -> None:
    out, _, folder = report
    assert out.exists() and out.name == "report.html"
    pngs = {p.stem.removeprefix("report_"): p for p in folder.glob("*.png")}
    assert set(pngs) == set(plots.FIGURES)  # named after their page: report_loss_scale.png, ...
    for name, path in pngs.items():
        data = path.read_bytes()
        width, height = _png_size(data)
        assert 600 <= width <= 2400 and 100 <= height <= 2400, (name, width, height)
        assert 5_000 < len(data) < 2_000_000, (name, len(data))
        image = _read_png(path)
        assert image[..., :3].std() > 0.05, f"{name}.png is almost uniform"


def test_html_embeds_every_png_and_nothing_external(report: tuple[Path, list[dict], Path]) -> None:
    out, _, folder = report
    text = out.read_text(encoding="utf-8")
    uris = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    assert len(uris) == len(plots.FIGURES)
    embedded = {base64.b64decode(u) for u in uris}
    assert embedded == {p.read_bytes() for p in folder.glob("*.png")}
    assert not re.search(r'(src|href)="(?!data:|#)', text), "the page must not load anything from elsewhere"
    assert "http://" not in text and "https://" not in text


def test_names_are_escaped(report: tuple[Path, list[dict], Path]) -> None:
    text = report[0].read_text(encoding="utf-8")
    assert "<script" not in text.lower(), "a module name came through as markup"
    assert html.escape(SCRIPT_NAME) in text
    assert html.escape(AMP_NAME) in text and AMP_NAME not in text
    assert "no NVML <b>" not in text
    assert "\\n" not in text and "\\x" not in text, "a text of the page was escaped that has no unprintable character"


BIDI_NAME = "head.\u202eevil\x1b[31m"  # a bidi override reverses what follows it; an ANSI colour escape


def test_unprintable_characters_in_a_name_are_shown_escaped(tmp_path: Path) -> None:
    """A name with a bidi override renders reversed in a browser as it does in a terminal: the page shows it as
    the console does, its unprintable characters written as escapes (and the neighbour, a plain name, as it is)."""
    log = tmp_path / "run.jsonl"
    with RunLog(log) as w:
        for step in range(3):
            offenders = [BIDI_NAME, "plain.name"]
            w.write({"step": step, "scale": 1024.0, "skipped": True, "total_norm": math.inf, "offenders": offenders})
    text = write_report(log, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "\u202e" not in text and "\x1b" not in text
    assert html.escape("head.\\u202eevil\\x1b[31m") in text
    assert "plain.name" in text


def test_offenders_table_and_advice(report: tuple[Path, list[dict], Path]) -> None:
    out, records, _ = report
    text = out.read_text(encoding="utf-8")
    # The offenders table (counts), after the table of where the NaN/Inf started (blame).
    table = re.search(r'Offenders: modules.*?<table class="offenders">(.*?)</table>', text, re.S)
    assert table, "no offenders table"
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in rows]
    by_module = {html.unescape(c[0]): c for c in cells if c}
    script_steps = [r["step"] for r in records if r["skipped"] and SCRIPT_NAME in r["offenders"]]
    row = by_module[SCRIPT_NAME]
    assert row[1] == str(len(script_steps))
    assert row[2] == str(script_steps[0]) and row[3] == str(script_steps[-1])
    assert by_module[AMP_NAME][1] == str(len(NAN_STEPS))
    producers = re.search(r"<h2>First non-finite producers.*?</ul>", text, re.S)
    assert producers, "no section for the activation hooks' findings"
    assert "forward output overflowed fp16" in producers.group(0)
    assert "forward output is NaN" in producers.group(0)
    assert 'class="advice"' in text and "growth_interval" in text  # the scale keeps bouncing off a ceiling
    skipped = sum(r["skipped"] for r in records)
    assert f"{skipped / len(records):.1%}" in text
    assert "2^" in text and "final loss scale" in text.lower()


def _read_png(path: Path) -> np.ndarray:
    import matplotlib.image

    return np.asarray(matplotlib.image.imread(path), dtype=np.float64)


@pytest.mark.parametrize(
    "kind",
    ["one_record", "no_hist", "no_hardware", "no_scale", "empty_hist_every"],
)
def test_edge_logs_render(tmp_path: Path, kind: str) -> None:
    log = tmp_path / "run.jsonl"
    if kind == "one_record":
        make_log(log, steps=1)
    elif kind == "no_hist":
        make_log(log, steps=12, hist_every=0)
    elif kind == "no_hardware":
        make_log(log, steps=12, with_hardware=False)
    elif kind == "no_scale":
        make_log(log, steps=12, with_scale=False)
    else:
        make_log(log, steps=5, hist_every=100, seed=3)
    out = write_report(log, tmp_path / "report.html", png_dir=tmp_path / "png")
    text = out.read_text(encoding="utf-8")
    assert text.count("data:image/png;base64,") == len(plots.FIGURES)
    assert {p.stem for p in (tmp_path / "png").glob("*.png")} == {f"report_{name}" for name in plots.FIGURES}
    if kind == "no_hardware":
        assert "not available" in text and "no NVML &lt;b&gt;" in text
    if kind == "no_hist":
        assert "No exponent histograms" in text or "no exponent histograms" in text.lower()
    if kind == "no_scale":
        assert "final loss scale" in text.lower() and "none" in text


def test_nonfinite_only_and_module_free_records(tmp_path: Path) -> None:
    """Records with only NaN norms and no modules (a hand-written or truncated log) still give a report."""
    log = tmp_path / "run.jsonl"
    with RunLog(log) as w:
        for step in range(3):
            w.write({"step": step, "scale": None, "skipped": True, "total_norm": math.nan, "offenders": ["x$y"]})
    out = write_report(log, tmp_path / "r.html")
    assert out.read_text(encoding="utf-8").count("data:image/png;base64,") == len(plots.FIGURES)


def test_figures_are_standalone_figures(report: tuple[Path, list[dict], Path]) -> None:
    """Each plot function returns a Figure made without pyplot (no global figure state is left behind)."""
    import sys

    from matplotlib.figure import Figure

    _, records, _ = report
    for name, plot in plots.PLOTTERS.items():
        assert isinstance(plot(records), Figure), name
    fig = plots.heatmap_over_time(records, module=AMP_NAME)
    assert AMP_NAME in "".join(ax.get_title(loc="left") for ax in fig.axes)
    if "matplotlib.pyplot" in sys.modules:
        import matplotlib.pyplot as plt

        assert plt.get_fignums() == []


def test_short_names() -> None:
    assert plots.short_name("blocks.0.attn") == "blocks.0.attn"
    cut = plots.short_name(LONG_NAME, 34)
    assert cut.startswith("…") and LONG_NAME.endswith(cut[1:]) and len(cut) <= 34
    a, b = "x" * 40 + ".layers.1.attn.proj", "y" * 40 + ".layers.1.attn.proj"
    sa, sb = plots.short_names([a, b], 20)
    assert sa != sb
    assert plots.short_names(["cost $ in $"])[0] == r"cost \$ in \$"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="headless rendering needs a chromium binary on PATH (none found)")
def test_page_renders_with_its_images_in_chromium(report: tuple[Path, list[dict], Path], tmp_path: Path) -> None:
    """Chromium draws the page, images included: many saturated colours (heatmaps, plot lines) appear in
    the screenshot, which text, tables and a broken-image icon alone would not give."""
    out, _, _ = report
    shot = tmp_path / "shot.png"
    command = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,4000",
        f"--screenshot={shot}",
        out.resolve().as_uri(),
    ]
    try:
        subprocess.run(command, capture_output=True, timeout=CHROMIUM_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish within {CHROMIUM_TIMEOUT_S} s")
    assert shot.exists(), "chromium wrote no screenshot"
    image = _read_png(shot)[..., :3]
    height, width, _ = image.shape
    assert (width, height) == (1280, 4000)
    # Not blank: a good share of non-white pixels, and most rows of the page carry something.
    nonwhite = (image < 0.95).any(axis=2)
    assert nonwhite.mean() > 0.08, f"only {nonwhite.mean():.1%} of the page is drawn"
    busy_rows = (image.std(axis=(1, 2)) > 0.02).mean()
    assert busy_rows > 0.5, f"only {busy_rows:.0%} of the rows vary"
    # Images drawn: saturated pixels in many distinct colours (the viridis heatmaps, bands and lines).
    saturation = image.max(axis=2) - image.min(axis=2)
    saturated = image[saturation > 0.25]
    distinct = len(np.unique((saturated * 255).round().astype(np.uint8), axis=0))
    assert len(saturated) > 100_000, f"{len(saturated)} saturated pixels: the plots were not drawn"
    assert distinct > 300, f"{distinct} distinct saturated colours: the heatmaps were not drawn"


def test_distributed_log_names_the_ranks_behind_skips(tmp_path: Path) -> None:
    """A log with inf_by_rank (DDP / FSDP2 runs) gets a section naming the ranks, and single-rank advice."""
    log = tmp_path / "run.jsonl"
    with RunLog(log) as w:
        for step in range(6):
            skipped = step % 2 == 1
            w.write(
                {
                    "step": step,
                    "scale": 1024.0,
                    "skipped": skipped,
                    "total_norm": math.inf if skipped else 1.0,
                    "offenders": ["head"] if skipped else [],
                    "inf_by_rank": {"3": {"head": 2}} if skipped else {},
                    "inf_origin": "before_allreduce",
                }
            )
    text = write_report(log, tmp_path / "r.html").read_text(encoding="utf-8")
    assert "Ranks behind skipped steps (NaN/Inf in their own gradients, before the all-reduce)" in text
    assert "rank 3 &mdash; on 3 skipped steps" in text
    assert "came from rank 3 alone" in text


# ---- poisoned steps in the pictures, the report and the console ----


def test_poisoned_steps_in_plots_html_and_console(tmp_path, capsys) -> None:
    from amp_inspect.render import console, html_report, plots

    records = [
        {"step": s, "scale": None, "skipped": False, "poisoned": s == 2, "offenders": ["a"] if s == 2 else []}
        for s in range(4)
    ]
    series = plots.RunSeries.from_records(records)
    assert series.poisoned.tolist() == [False, False, True, False] and not series.skipped.any()
    fig = plots.loss_scale(series)
    assert "1 poisoned" in fig.axes[0].get_title(loc="left")
    summary = summarize([StepRecord.from_log_record(r) for r in records])
    page = html_report.render_html(series, summary, {}, source="run.jsonl")
    assert "poisoned steps" in page.lower() and "Poisoned steps: modules" in page
    console.print_summary(summary)
    out = " ".join(capsys.readouterr().out.split())  # rich may wrap a long title
    assert "1 poisoned" in out and "gradients on poisoned steps" in out
