"""Hostile names and logs are harmless (issue 18, cases 5, 6, 14).

- Terminal escapes, OSC sequences, newlines and bidi overrides in module names print escaped everywhere a
  name is printed: ``amp-inspect summary``, ``print(insp.summary())``, ``print(report)``, the console tables,
  the PNG heatmap's labels, the CLI's one-line errors and warnings. HTML escapes on its own.
- A 30-million-character module name is shown cut in its middle (how many characters left out).
- A module record that lacks a count field is an invalid line (skipped with a warning), not a KeyError.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.cli import commands as cli
from amp_inspect.core.printable import MAX_SHOWN, shown_name
from amp_inspect.core.recipes import RECIPE_NAMES
from amp_inspect.runlog.log import RunLog
from tests.run_logs import module_record

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None

RED = "\x1b[31mred"
OSC = "\x1b]0;owned\x07title"
FORGED = "fc\nadvice: set init_scale=1e30"
BIDI = "a\u202eevil"
HOSTILE = [RED, OSC, FORGED, BIDI]
RAW_BITS = ["\x1b", "\x07", "\u202e", "\nadvice: set"]


def _write(path: Path, records: list[dict]) -> Path:
    with RunLog(path) as log:
        for r in records:
            log.write(r)
    return path


def _skipped_step(step: int, names: list[str]) -> dict:
    return {
        "step": step,
        "scale": 1024.0,
        "skipped": True,
        "total_norm": "nan",  # as the writer stores a non-finite float (a NaN literal is no JSON: not a log line)
        "offenders": names,
        "headroom": {"up": 0, "down": 3},
        "modules": {n: module_record(nan=1) for n in names},
        "first_nonfinite": names[0],
    }


def _assert_clean(text: str) -> None:
    for bit in RAW_BITS:
        assert bit not in text, (bit, text[:400])


def test_shown_name_escapes_what_cannot_print_and_keeps_the_rest() -> None:
    assert shown_name("blocks.1.mlp.fc2") == "blocks.1.mlp.fc2"
    assert shown_name("层.权重 ünïcode") == "层.权重 ünïcode"
    assert shown_name(RED) == "\\x1b[31mred"
    assert shown_name(BIDI) == "a\\u202eevil"
    assert shown_name(FORGED) == "fc\\nadvice: set init_scale=1e30"
    assert shown_name("lone\ud800") == "lone\\ud800"  # would crash a UTF-8 print
    long = "x" * 3_000_000 + "\x1b"
    shown = shown_name(long)
    assert len(shown) < MAX_SHOWN + 40 and "[2999861 characters]" in shown and shown.endswith("\\x1b")
    assert shown_name(long, limit=None).endswith("\\x1b") and len(shown_name(long, limit=None)) == 3_000_004


def test_summary_cli_prints_hostile_names_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Case 14: before, the escapes reached the terminal raw and the newline forged an advice line."""
    path = _write(tmp_path / "run.jsonl", [_skipped_step(0, HOSTILE), _skipped_step(1, HOSTILE)])
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    _assert_clean(out)
    assert "\\x1b[31mred" in out and "a\\u202eevil" in out
    assert not any(line.startswith("advice: set init_scale") for line in out.splitlines())


def test_inspector_summary_and_report_print_hostile_names_escaped() -> None:
    """Case 14 through the public API: print(insp.summary()) and print(report)."""

    class Hostile(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name in HOSTILE:
                self.add_module(name, nn.Linear(4, 4))
            # One module keeps finite gradients: with every module's gradients Inf the blame names no module
            # (attribution.FROM_EVERY_MODULE), and a hostile name must be printed here.
            self.add_module("clean", nn.Linear(4, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum(m(x) for m in self.children())

    model = Hostile()
    insp = amp_inspect.attach(model)
    for _ in range(2):
        model(torch.randn(2, 4)).sum().backward()
        for name in HOSTILE:
            for p in model.get_submodule(name).parameters():
                p.grad.fill_(math.inf)
        report = insp.check()
        model.zero_grad()
    insp.detach()
    assert set(report.offenders) == set(HOSTILE)  # the data keeps the names as they are
    _assert_clean(str(report))
    _assert_clean(str(insp.summary()))
    assert "\\x1b[31mred" in str(report) and "a\\u202eevil" in str(insp.summary())


def test_cli_errors_and_warnings_print_hostile_text_escaped(tmp_path: Path, capsys) -> None:
    path = tmp_path / "x\x1b[2Jy.jsonl"
    assert cli.main(["summary", str(path)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "x\\x1b[2Jy.jsonl: no such file" in err


@pytest.mark.skipif(not HAVE_MPL, reason="needs matplotlib")
def test_png_heatmap_labels_are_escaped() -> None:
    from amp_inspect.render.plots import short_names

    labels = short_names(HOSTILE)
    assert all(c.isprintable() for label in labels for c in label)
    assert any("\\u202e" in label for label in labels)


def test_a_30_million_character_name_is_summarised_quickly(tmp_path: Path, capsys) -> None:
    """Case 5: before, the table folded the whole name (1.6 M characters: 3 s, 30 M: over 300 s). The output
    is bounded by the cut, whatever the name's length (no timing: the size of what is printed is the measure)."""
    name = "n" * 30_000_000
    path = tmp_path / "run.jsonl"
    record = {"schema": 1, "log": "amp_inspect", "time": 1.0, **_skipped_step(0, [name])}
    path.write_text(json.dumps(record) + "\n", encoding="utf-8")
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "[29999860 characters]" in out
    assert len(out) < 20_000


def test_a_module_record_lacking_a_count_is_summarised(tmp_path: Path, capsys) -> None:
    """Case 6: before, KeyError 'nan' (attribution) or 'amax' (console) from amp-inspect summary; report and
    doctor already took a missing count as 0. Now summary does too (a missing float shows as unknown)."""
    for missing in ("nan", "amax", "numel"):
        path = tmp_path / f"{missing}.jsonl"
        step = _skipped_step(0, ["fc", "other"])
        step["modules"]["fc"] = module_record(nan=1, drop=missing)
        _write(path, [step])
        assert cli.main(["summary", str(path)]) == 0, missing
        captured = capsys.readouterr()
        assert "1 inspected steps, 1 skipped" in captured.out and "Traceback" not in captured.err
        table = captured.out[captured.out.index("last inspected step") :]
        fc_row = next(line for line in table.splitlines() if " fc " in line)
        assert ("unknown" in fc_row) == (missing == "amax")  # a missing value is unknown, not 0
        assert " other " in table  # fc without a NaN count is still in trouble (subnormal, underflow)


# ---- every string read from a log, not only names (issue 31, item 17) ----

TITLE = "\x1b]0;title\x07"  # OSC: retitles the terminal
RED_ON = "\x1b[31m"  # turns the text red
ISOLATE = "blocks.\u20661\u2069.fc"  # bidi isolates (U+2066, U+2069): a figure drew them raw
LOG_TEXT_BITS = ["\x1b", "\x07", "\u2066", "\u2069"]
MATHTEXT = "head$\\frac$"  # an unfinished TeX fraction: drawn as mathtext, it stopped the report (ParseSyntaxException)


def _hostile_strings_log(path: Path) -> Path:
    """A log whose every string field carries terminal escapes, and whose module name carries bidi isolates."""
    text = f"{TITLE}{RED_ON}x"
    update = {**module_record(), "numel_with_grad": 10, "lost": 5, "changed": 5, "weight_nonfinite": 0}
    update |= {"weight_subnormal": 0, "state_underflow": 2, "sq_change": 1e-6, "sq_weight": 1.0, "weight_amax": 1.0}
    update |= {"dtype": text + "dtype", "state_dtype": text + "state"}
    n = len(RECIPE_NAMES)
    x = {"numel": 10, "nonzero": 10, "nonfinite": 0, "flushed": [1] * n, "saturated": [0] * n, "blocks": [1] * n}
    operands = {"X": x | {"scale_flushed": [0] * n, "sq_signal": 1.0, "sq_error": [0.01] * n, "amax": 1.0}}
    records = []
    for step in range(4):
        skipped = step in (1, 2)
        record = _skipped_step(step, [ISOLATE])
        record["first_nonfinite"] = f"{text}finding {ISOLATE}" if skipped else None
        if not skipped:
            record |= {"skipped": False, "total_norm": 1.0, "offenders": [], "modules": {ISOLATE: module_record()}}
        record["hist"] = {ISOLATE: {"120": 9}}
        record["scale_decision"] = {
            "scale": 512.0 if skipped else 1024.0,
            "previous": 1024.0,
            "reason": text + "reason",
            "skip": text + "skip" if skipped else None,
            "margin": 1,
            "room": 2,
            "room_from": text + "room",
            "offenders": [ISOLATE] if skipped else [],
            "policy": text + "policy",
        }
        record |= {"hardware_note": text + "note", "hardware": {"rss_bytes": 1e9}, "formats": [text + "fmt"]}
        record |= {"autocast": text + "autocast", "update": {"modules": {ISOLATE: update, MATHTEXT: update}}}
        record["readiness"] = {"recipes": list(RECIPE_NAMES), "modules": {ISOLATE: operands, MATHTEXT: operands}}
        if step == 2:
            record["weights"] = {"into_step": 2, "nonfinite": {ISOLATE: 3}, "partial": text + "partial"}
        records.append(record)
    return _write(path, records)


def _clean(text: str) -> bool:
    return not any(bit in text for bit in LOG_TEXT_BITS)


def test_every_string_of_a_log_prints_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31, item 17: before, an update's dtype (`updates --step`), a scale decision's reason (`summary`) and a
    hardware note (`doctor --log`) printed raw: the terminal's title changed and the text turned red."""
    log = _hostile_strings_log(tmp_path / "run.jsonl")
    outputs = {}
    for argv in (["summary"], ["updates"], ["updates", "--step", "3"], ["readiness"], ["doctor", "--log"]):
        assert cli.main([*argv, str(log)]) in (0, 1), argv  # the doctor says 1: it finds errors
        captured = capsys.readouterr()
        outputs[" ".join(argv)] = captured.out + captured.err
    for argv, out in outputs.items():
        assert _clean(out), (argv, [line for line in out.splitlines() if not _clean(line)][:3])
    escaped = "\\x1b]0;title\\x07\\x1b[31mx"
    assert f"{escaped}dtype" in outputs["updates --step 3"]
    assert f"2 {escaped}reason" in outputs["summary"] and f"autocast {escaped}autocast" in outputs["summary"]
    assert f"in the run: {escaped}note" in outputs["doctor --log"]
    assert "blocks.\\u20661\\u2069.fc" in outputs["summary"]
    # The neighbour: plain words of a log print as they are.
    plain = _write(tmp_path / "plain.jsonl", [{**_skipped_step(0, ["fc"]), "hardware_note": "no NVML here"}])
    assert cli.main(["doctor", "--log", str(plain)]) in (0, 1)
    assert "INFO [hardware-note] in the run: no NVML here" in capsys.readouterr().out


@pytest.mark.skipif(not HAVE_MPL, reason="needs matplotlib")
def test_every_text_a_figure_draws_from_a_log_is_escaped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 31, item 17: before, the figures drew U+2066 and U+2069 of a module name raw (the over-time heatmap's
    title, the loss-scale figure's notes), and a decision's reason and a hardware note with their escapes."""
    from matplotlib.text import Text

    from amp_inspect.readiness.plot import readiness_heatmap
    from amp_inspect.readiness.report import from_log as readiness_from_log
    from amp_inspect.render.plots import PLOTTERS, mpl_text
    from amp_inspect.render.series import RunSeries
    from amp_inspect.runlog.log import read_log
    from amp_inspect.updates.plot import update_ratio_figure
    from amp_inspect.updates.report import from_log

    log = _hostile_strings_log(tmp_path / "run.jsonl")
    assert cli.main(["report", str(log)]) == 0
    err = capsys.readouterr().err
    assert "Glyph" not in err and _clean(err)  # before: "Glyph 27 (\x1b) missing from font(s)" for each escape
    records = read_log(log)
    series = RunSeries.from_records(records)
    figures = {name: plot(series) for name, plot in PLOTTERS.items()}
    figures["update_ratio"] = update_ratio_figure(from_log(records))
    figures["readiness"] = readiness_heatmap(readiness_from_log(records)[-1])
    drawn = []
    for name, fig in figures.items():
        fig.canvas.draw()  # tick labels and legends exist once drawn
        texts = [t.get_text() for t in fig.findobj(Text)]
        bad = [t for t in texts if not all(c.isprintable() or c == "\n" for c in t)]
        assert not bad, (name, bad[:3])
        drawn += texts
    assert any("blocks.\\u20661\\u2069.fc" in t for t in drawn)  # the name is there, escaped
    assert sum("head\\$\\frac\\$" in t for t in drawn) >= 2  # the update-ratio legend, the readiness rows
    assert any("reason" in t and "\\x1b" in t for t in drawn) and any("note" in t and "\\x07" in t for t in drawn)
    assert mpl_text("blocks.3.fc $x$") == r"blocks.3.fc \$x\$"  # the neighbour: plain text kept, mathtext off
