"""The command line: every subcommand has --help, and demo, summary, report, bench and info run."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from amp_inspect import read_log
from amp_inspect.cli import commands as cli
from amp_inspect.diagnosis.doctor import doctor
from amp_inspect.runlog.log import RunLog
from tests.run_logs import HAVE_MPL, log_record, needs_mpl, write_log

COMMANDS = ["demo", "report", "summary", "bench", "info"]


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--help"] if command is None else [command, "--help"]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 0
    assert "usage: amp-inspect" in capsys.readouterr().out


def test_demo_finds_the_planted_trouble(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    assert cli.main(["demo", "--steps", "60", "--trouble-from", "5", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    records = read_log(out / "run.jsonl")
    assert len(records) == 60
    # fp16 autocast with its GradScaler on the CPU too: the doctor finds nothing wrong with the demo's own set-up
    # (it ran bf16 there with a scaler, which the doctor's scaler-with-bf16 calls useless).
    assert {r["autocast"] for r in records} == {"fp16"}
    own_setup = doctor(scaler=torch.amp.GradScaler("cpu"), autocast_dtype=records[0]["autocast"])
    assert not {f.code for f in own_setup.findings} & {"scaler-with-bf16", "no-grad-scaler"}
    skipped = [r for r in records if r["skipped"]]
    assert skipped, "the planted overflow made GradScaler skip steps"
    findings = {r["first_nonfinite"] for r in records if r.get("first_nonfinite")}
    assert any(f.startswith("blocks.3.attn.scores: forward output") for f in findings), findings
    assert "skipped" in text and "blocks.3.attn.scores" in text
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "report.html").stat().st_size > 10_000

    assert cli.main(["summary", str(out / "run.jsonl")]) == 0
    summary = capsys.readouterr().out
    assert "inspected steps" in summary
    # The planted bf16 module without a master copy: its updates are rounded away, and it alone is named.
    lost = next(line for line in summary.splitlines() if "were rounded away" in line)
    assert "of 1 module were rounded away (bf16 weights without a master copy" in lost
    assert "worst: blocks.2.mlp.fc2 " in lost
    # Every 10th step measured, or the first one after it that GradScaler did not skip (the demo's scale hits
    # fp16's ceiling on some multiples of 10).
    skipped_steps = {r["step"] for r in records if r["skipped"]}
    expected = []
    for multiple in range(0, 30, 10):
        step = multiple
        while step in skipped_steps:
            step += 1
        expected.append(step)
    assert [r["step"] for r in records if "update" in r][:3] == expected


def test_summary_of_an_empty_log(tmp_path) -> None:
    log = tmp_path / "empty.jsonl"
    log.write_text("")
    assert cli.main(["summary", str(log)]) == 1


def test_bench_builtin_and_info(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "--builtin"]) == 0
    out = capsys.readouterr().out
    assert "76 gradient tensors" in out and "per_tensor_python" in out
    assert cli.main(["info"]) == 0
    assert "CUDA kernel" in capsys.readouterr().out


def test_bench_in_a_source_checkout_finds_the_full_benchmark() -> None:
    # The tests run from a checkout: `amp-inspect bench` (no --builtin) must find bench/ beside the package,
    # wherever the command's module sits inside it.
    assert cli.SOURCE_BENCH.is_file(), cli.SOURCE_BENCH


# ---- logs read past bad lines, outputs never overwrite a log, hostile files in one line ----


def test_summary_and_report_read_past_a_bad_middle_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_log(tmp_path / "run.jsonl", [log_record(0), log_record(1, skipped=True)])
    with open(path, "ab") as f:
        f.write(b'{"schema":1,"step":2,"sk\n')  # torn mid-line, then the run went on
    with RunLog(path) as log:
        log.write(log_record(3))
    assert cli.main(["summary", str(path)]) == 0
    captured = capsys.readouterr()
    assert "3 inspected steps, 1 skipped" in captured.out
    assert "skipped 1 invalid line of 4" in captured.err and "line 3 " in captured.err
    assert "Traceback" not in captured.err
    if HAVE_MPL:
        assert cli.main(["report", str(path)]) == 0
        assert (tmp_path / "report.html").exists()
        assert "line 3 " in capsys.readouterr().err


@needs_mpl
def test_report_never_overwrites_the_log_and_needs_force_for_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "run.jsonl", [log_record(s, skipped=s == 2) for s in range(5)])
    before = log.read_bytes()
    for target in (log, tmp_path / "other_run.jsonl"):
        if target != log:
            write_log(target, [log_record(0)])
        kept = target.read_bytes()
        for force in ([], ["--force"]):
            assert cli.main(["report", str(log), "-o", str(target), *force]) == 2
            assert "refusing to overwrite the run log" in capsys.readouterr().err
            assert target.read_bytes() == kept
    assert log.read_bytes() == before

    assert cli.main(["report", str(log)]) == 0
    html = tmp_path / "report.html"
    html.write_text("mine")
    png = tmp_path / "report_loss_scale.png"
    png_bytes = png.read_bytes()
    assert cli.main(["report", str(log)]) == 2
    err = capsys.readouterr().err
    assert "already exist" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert html.read_text() == "mine" and png.read_bytes() == png_bytes
    assert cli.main(["report", str(log), "--force"]) == 0
    assert html.read_text() != "mine"
    assert cli.main(["report", str(log), "-o", str(tmp_path / "new" / "r.html")]) == 0  # a new name is fine
    assert log.read_bytes() == before


def _update_entry(sq_change: float, sq_weight: float) -> dict:
    """A run log's "update" of one module "layer" (updates/report.py: the fields)."""
    record = {"numel": 10, "numel_with_grad": 10, "lost": 1, "changed": 9, "weight_nonfinite": 0}
    record |= {"weight_subnormal": 0, "state_underflow": 0, "weight_amax": 1.0, "dtype": "bf16", "state_dtype": "bf16"}
    return {"modules": {"layer": record | {"sq_change": sq_change, "sq_weight": sq_weight}}}


def _readiness_entry(sq_error: float) -> dict:
    """A run log's "readiness" of one module "layer", operand X (readiness/report.py: the fields)."""
    from amp_inspect.core.recipes import RECIPE_NAMES

    n = len(RECIPE_NAMES)
    operand = {"numel": 10, "nonzero": 10, "nonfinite": 0, "flushed": [0] * n, "saturated": [0] * n}
    operand |= {"blocks": [1] * n, "scale_flushed": [0] * n, "sq_signal": 1.0, "sq_error": [sq_error] * n, "amax": 1.0}
    return {"recipes": list(RECIPE_NAMES), "modules": {"layer": {"X": operand}}}


@needs_mpl
def test_report_names_a_sum_of_squares_out_of_its_domain_and_writes_nothing_it_cannot_finish(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, item 9: before, "math domain error" after writing the PNGs (a negative sq_weight, an infinite
    sq_error), and the retry refused because they "already exist". Now the record is refused where the log is
    read, naming the field, like any invalid record; the valid records still make a report."""
    records = [log_record(s) for s in range(4)]
    for r in records:
        r["update"], r["readiness"] = _update_entry(1e-6, 1.0), _readiness_entry(0.5)  # the neighbours: valid
    records[1]["update"] = _update_entry(1e-6, -1.0)
    records[2]["readiness"] = _readiness_entry(math.inf)
    log = write_log(tmp_path / "run.jsonl", records)
    assert cli.main(["report", str(log)]) == 0
    err = capsys.readouterr().err
    assert "math domain error" not in err
    assert '"sq_weight" of module \'layer\' in "update" must be a finite sum of squares' in err
    assert "\"sq_error\" of module 'layer' operand 'X' in \"readiness\"" in err and "line 2 " in err
    page = (tmp_path / "report.html").read_text(encoding="utf-8")
    assert "2 inspected steps" in page and 'id="readiness"' in page and 'id="updates"' in page
    for command in ("summary", "updates", "readiness"):
        assert cli.main([command, str(log)]) == 0, command
        assert '"sq_weight"' in capsys.readouterr().err

    # A log with no record left: one line naming the field, and nothing written beside it (no PNG to block a retry).
    bad = tmp_path / "bad"
    bad.mkdir()
    only = write_log(bad / "run.jsonl", [{**log_record(0), "update": _update_entry(-2.0, 1.0)}])
    assert cli.main(["report", str(only)]) == 2
    err = capsys.readouterr().err
    assert "math domain error" not in err and len(err.strip().splitlines()) == 1
    assert 'line 1: "sq_change" of module \'layer\' in "update" must be a finite sum of squares (0 or more)' in err
    assert sorted(p.name for p in bad.iterdir()) == ["run.jsonl"]


@needs_mpl
def test_a_second_report_with_a_new_name_beside_the_first_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 31, item 9: before, a second report with a new -o was refused because the first one's PNGs existed
    beside the log. Figures are named after their report; a re-run of a report replaces only its own (--force)."""
    from amp_inspect.render.plots import FIGURES

    log = write_log(tmp_path / "run.jsonl", [log_record(s, skipped=s == 2) for s in range(5)])
    assert cli.main(["report", str(log)]) == 0
    first = {name: (tmp_path / f"report_{name}.png").read_bytes() for name in FIGURES}
    assert cli.main(["report", str(log), "-o", str(tmp_path / "second.html")]) == 0
    assert (tmp_path / "second.html").exists()
    assert all((tmp_path / f"second_{name}.png").read_bytes()[:4] == b"\x89PNG" for name in FIGURES)
    capsys.readouterr()
    # The same report again: still refused without --force (the page exists), and its advice names a free name.
    assert cli.main(["report", str(log), "-o", str(tmp_path / "second.html")]) == 2
    err = capsys.readouterr().err
    assert "already exist" in err and "--force" in err and f"-o {tmp_path / 'second-2.html'}" in err
    (tmp_path / "second_memory.png").write_bytes(b"stale")
    assert cli.main(["report", str(log), "-o", str(tmp_path / "second.html"), "--force"]) == 0
    assert (tmp_path / "second_memory.png").read_bytes()[:4] == b"\x89PNG"  # its own figure, replaced
    assert {name: (tmp_path / f"report_{name}.png").read_bytes() for name in FIGURES} == first  # the other's kept


def test_demo_keeps_an_earlier_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    log = write_log(out / "run.jsonl", [log_record(s) for s in range(2082)])
    before = log.read_bytes()
    (out / "report.html").write_text("earlier report")
    threads = torch.get_num_threads()
    assert cli.main(["demo", "--steps", "3", "--out", str(out)]) == 0
    assert torch.get_num_threads() == threads  # the demo trains on one thread and gives the caller's back
    assert log.read_bytes() == before
    assert (out / "report.html").read_text() == "earlier report"
    assert f"writing to {out}-2" in capsys.readouterr().out
    assert len(read_log(tmp_path / "demo-2" / "run.jsonl")) == 3


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--steps", "-1"],
        ["demo", "--steps", "0"],
        ["demo", "--trouble-from", "-5"],
        ["doctor", "--collapse-skips", "-1"],
        ["doctor", "--collapse-skips", "0"],
    ],
)
def test_negative_counts_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "or more, got" in err and "Traceback" not in err


def _hostile(tmp_path: Path) -> dict[str, Path]:
    d = tmp_path / "hostile"
    d.mkdir()
    files = {
        "missing": d / "missing.jsonl",
        "directory": d / "a_dir",
        "garbage": d / "garbage.jsonl",
        "binary": d / "binary.bin",
        "nested": d / "nested.jsonl",
        "array": d / "array.jsonl",
        "huge_int": d / "huge_int.jsonl",
    }
    files["directory"].mkdir()
    files["garbage"].write_text("hello\nthis is not json\n")
    files["binary"].write_bytes(bytes(range(256)) * 64)
    files["nested"].write_text("[" * 100_000 + "]" * 100_000 + "\n")
    files["array"].write_text("[1, 2, 3]\n")
    files["huge_int"].write_text('{"step": ' + "9" * 5000 + "}\n")
    wrong = {
        "step_str": {"step": "3"},
        "step_float": {"step": 1.5},
        "step_huge": {"step": 10**30},
        "step_past_2_53": {"step": 2**60},
        "headroom_huge": {"step": 0, "scale": 1024.0, "headroom": {"up": 2**62, "down": 0}},
        "step_bool": {"step": True},
        "offenders_int": {"step": 0, "offenders": 5},
        "offenders_list_of_int": {"step": 0, "offenders": [1, 2]},
        "modules_list": {"step": 0, "modules": [1]},
        "modules_str_count": {"step": 0, "modules": {"m": {"numel": "10", "nan": 0}}},
        "modules_negative_count": {"step": 0, "modules": {"m": {"numel": -10, "nan": 0}}},
        "headroom_str": {"step": 0, "headroom": "up"},
        "hist_bad_bin": {"step": 0, "hist": {"m": {"999": 1}}},
        "hist_str": {"step": 0, "hist": "x"},
        "skipped_str": {"step": 0, "skipped": "yes"},
        "poisoned_int": {"step": 0, "poisoned": 1},
        "sparse_modules_str": {"step": 0, "sparse_modules": "emb"},
        "scale_str": {"step": 0, "scale": "big"},
        "total_norm_none": {"step": 0, "total_norm": None},
        "inf_by_rank_bad": {"step": 0, "inf_by_rank": {"x": 1}},
    }
    for name, record in wrong.items():
        files[name] = d / f"{name}.jsonl"
        files[name].write_text(json.dumps(record) + "\n")
    return files


@pytest.mark.parametrize("command", ["summary", "report", "doctor"])
def test_hostile_files_give_one_line_and_exit_2(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if command == "report" and not HAVE_MPL:
        pytest.skip("the report needs matplotlib")
    for name, path in _hostile(tmp_path).items():
        argv = ["doctor", "--log", str(path)] if command == "doctor" else [command, str(path)]
        if command == "report":
            argv += ["-o", str(tmp_path / f"{name}.html")]
        assert cli.main(argv) == 2, name
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert len(lines) == 1, (name, captured.err)
        assert path.name in lines[0] and "Traceback" not in captured.err, (name, lines[0])


def test_a_wrong_typed_record_among_good_ones_is_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_log(tmp_path / "run.jsonl", [log_record(0), {"step": "one"}, log_record(2, skipped=True)])
    with pytest.warns(RuntimeWarning, match=r'line 2 \("step" must be an integer'):
        assert [r["step"] for r in read_log(path)] == [0, 2]
    assert cli.main(["summary", str(path)]) == 0
    assert "2 inspected steps, 1 skipped" in capsys.readouterr().out


_EXTREME = [
    {"scale": math.inf},
    {"scale": -math.inf},
    {"scale": math.nan},
    {"scale": -1.0},
    {"scale": 0.0},
    {"scale": 1e308},
    {"scale": 5e-324},
    {"total_norm": 1e308},
    {"total_norm": -1.0},
    {"total_norm": math.inf},
    {"time": 1e308},
    {"time": -1e308},
    {"step": 2**53 - 1},
    {"step": -(2**53) + 1},
    {"headroom": {"up": 1023, "down": -1023}},
    {"hardware": {"rss_bytes": 1e308, "torch_allocated": -1.0, "gpu_util": math.inf}},
    {"hardware": {"gpu_mem_used": math.inf, "gpu_mem_total": math.inf, "gpu_temp": 1e308}},
    {"hardware": {"gpu_mem_used": 7, "gpu_mem_total": "lots", "rss_bytes": [1]}},
]


@pytest.mark.parametrize("extreme", _EXTREME, ids=lambda e: f"{next(iter(e))}={next(iter(e.values()))!r:.12}")
def test_huge_and_nonfinite_values_summarise_and_render(
    tmp_path: Path, extreme: dict, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [log_record(s, skipped=s == 2) for s in range(4)]
    for r in records[1:3]:
        r.update(extreme)
    for r in records:
        r["modules"]["layer"]["amax"] = extreme.get("scale", 2.0) if isinstance(extreme.get("scale"), float) else 2.0
    path = write_log(tmp_path / "run.jsonl", records)
    assert cli.main(["summary", str(path)]) == 0, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err
    assert cli.main(["doctor", "--log", str(path)]) in (0, 1), capsys.readouterr().err
    if HAVE_MPL:
        assert cli.main(["report", str(path)]) == 0, capsys.readouterr().err
