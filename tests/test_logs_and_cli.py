"""Logs that lose nothing and commands that answer in one line (issue 10, cases 9-11, 14, 15).

- ``log=`` pointed at a file that is not a run log is refused and left byte-identical.
- A torn or bad line in the middle of a log is skipped with a warning naming it; the good records are read.
- ``amp-inspect demo`` and ``report`` never overwrite a run log; other outputs only with ``--force``.
- ``summary`` / ``report`` / ``doctor --log`` on hostile files: one line naming the file, exit code 2.
- Module names with rich markup print literally.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import math
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect import cli, read_log
from amp_inspect.runlog import RunLog

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
needs_mpl = pytest.mark.skipif(not HAVE_MPL, reason="the report needs matplotlib")


def _record(step: int, skipped: bool = False, name: str = "layer") -> dict:
    return {
        "step": step,
        "scale": 1024.0,
        "skipped": skipped,
        "total_norm": math.nan if skipped else 1.0,
        "offenders": [name] if skipped else [],
        "headroom": {"up": 3, "down": 12},
        "modules": {
            name: {
                "numel": 10,
                "nan": int(skipped),
                "posinf": 0,
                "neginf": 0,
                "zero": 1,
                "overflow": 0,
                "subnormal": 2,
                "underflow": 1,
                "amax": 2.0,
                "grad_norm": 1.0,
            }
        },
        "hist": {name: {"120": 9, "255": int(skipped)}},
    }


def _write_log(path: Path, records: list[dict]) -> Path:
    with RunLog(path) as log:
        for r in records:
            log.write(r)
    return path


# ---- case 9: log= at a file that is not a run log ----


@pytest.mark.parametrize("kind", ["checkpoint", "text", "text_no_newline", "jsonl_of_another_tool"])
def test_log_at_a_foreign_file_is_refused_and_left_untouched(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "target"
    if kind == "checkpoint":
        torch.save({"w": torch.arange(100.0)}, path)
    elif kind == "text":
        path.write_text("notes\nmore notes\n", encoding="utf-8")
    elif kind == "text_no_newline":
        path.write_text("line one\nthe last line has no newline", encoding="utf-8")
    else:
        path.write_text('{"loss": 1.0}\n{"loss": 0.5', encoding="utf-8")
    before = path.read_bytes()
    model = nn.Linear(4, 4)
    with pytest.raises(ValueError, match=r"exists and is not an amp_inspect run log"):
        insp = amp_inspect.attach(model, log=path)
        insp.detach()  # before the fix: attach, then detach with no step, cut the "torn last line"
    assert path.read_bytes() == before
    if kind == "checkpoint":
        assert torch.equal(torch.load(path)["w"], torch.arange(100.0))


def test_log_at_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="is a directory"):
        RunLog(tmp_path)


def test_our_torn_log_and_empty_files_are_still_appended_to(tmp_path: Path) -> None:
    ours = _write_log(tmp_path / "run.jsonl", [_record(0)])
    with open(ours, "ab") as f:
        f.write(b'{"schema":1,"time":1.0,"st')  # a killed run's torn tail
    with pytest.warns(RuntimeWarning, match="torn last line"), RunLog(ours) as log:
        log.write(_record(1))
    assert [r["step"] for r in read_log(ours)] == [0, 1]
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with RunLog(empty) as log:
        log.write(_record(0))
    assert [r["step"] for r in read_log(empty)] == [0]


# ---- case 10: a torn or bad line in the middle ----


class _DiskFull:
    """A file whose next write stores half the line, then fails as a full disk does."""

    def __init__(self, file) -> None:
        self.file = file
        self.fail = True

    def write(self, data) -> int:
        if self.fail:
            self.fail = False
            self.file.write(bytes(data[: len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def test_disk_full_mid_line_then_the_loop_goes_on(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = RunLog(path)
    log.write(_record(0))
    log.write(_record(1))
    real = log._file
    log._file = _DiskFull(real)
    with pytest.raises(OSError, match="No space"):
        log.write(_record(2))
    log._file = real
    log.write(_record(3))
    log.write(_record(4, skipped=True))
    log.close()
    with pytest.warns(RuntimeWarning, match=r"run\.jsonl: skipped 1 invalid line of 5, read 4 records: line 3 ") as w:
        records = read_log(path)
    assert len(w) == 1
    assert [r["step"] for r in records] == [0, 1, 3, 4]
    assert records[-1]["skipped"] is True


def test_glued_record_after_a_torn_one_is_recovered(tmp_path: Path) -> None:
    # What an older writer left after a failed write: the next record glued onto the torn line.
    path = _write_log(tmp_path / "run.jsonl", [_record(0)])
    line = json.dumps({"schema": 1, "step": 2}, separators=(",", ":")).encode()
    with open(path, "ab") as f:
        f.write(b'{"schema":1,"time":1.0,"step":1,"sca' + line + b"\n")
    with pytest.warns(RuntimeWarning, match=r"line 2 \(torn, followed by a whole record\)"):
        assert [r["step"] for r in read_log(path)] == [0, 2]


def test_summary_and_report_read_past_a_bad_middle_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_log(tmp_path / "run.jsonl", [_record(0), _record(1, skipped=True)])
    with open(path, "ab") as f:
        f.write(b'{"schema":1,"step":2,"sk\n')  # torn mid-line, then the run went on
    with RunLog(path) as log:
        log.write(_record(3))
    assert cli.main(["summary", str(path)]) == 0
    captured = capsys.readouterr()
    assert "3 inspected steps, 1 skipped" in captured.out
    assert "skipped 1 invalid line of 4" in captured.err and "line 3 " in captured.err
    assert "Traceback" not in captured.err
    if HAVE_MPL:
        assert cli.main(["report", str(path)]) == 0
        assert (tmp_path / "report.html").exists()
        assert "line 3 " in capsys.readouterr().err


# ---- case 11: never overwrite a run log; other outputs only with --force ----


@needs_mpl
def test_report_never_overwrites_the_log_and_needs_force_for_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _write_log(tmp_path / "run.jsonl", [_record(s, skipped=s == 2) for s in range(5)])
    before = log.read_bytes()
    for target in (log, tmp_path / "other_run.jsonl"):
        if target != log:
            _write_log(target, [_record(0)])
        kept = target.read_bytes()
        for force in ([], ["--force"]):
            assert cli.main(["report", str(log), "-o", str(target), *force]) == 2
            assert "refusing to overwrite the run log" in capsys.readouterr().err
            assert target.read_bytes() == kept
    assert log.read_bytes() == before

    assert cli.main(["report", str(log)]) == 0
    html = tmp_path / "report.html"
    html.write_text("mine")
    png = tmp_path / "loss_scale.png"
    png_bytes = png.read_bytes()
    assert cli.main(["report", str(log)]) == 2
    err = capsys.readouterr().err
    assert "already exist" in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert html.read_text() == "mine" and png.read_bytes() == png_bytes
    assert cli.main(["report", str(log), "--force"]) == 0
    assert html.read_text() != "mine"
    assert cli.main(["report", str(log), "-o", str(tmp_path / "new" / "r.html")]) == 0  # a new name is fine
    assert log.read_bytes() == before


def test_demo_keeps_an_earlier_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "demo"
    out.mkdir()
    log = _write_log(out / "run.jsonl", [_record(s) for s in range(2082)])
    before = log.read_bytes()
    (out / "report.html").write_text("earlier report")
    assert cli.main(["demo", "--steps", "3", "--out", str(out)]) == 0
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


# ---- case 14: hostile files, one line, exit code 2 ----


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
    path = _write_log(tmp_path / "run.jsonl", [_record(0), {"step": "one"}, _record(2, skipped=True)])
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
    records = [_record(s, skipped=s == 2) for s in range(4)]
    for r in records[1:3]:
        r.update(extreme)
    for r in records:
        r["modules"]["layer"]["amax"] = extreme.get("scale", 2.0) if isinstance(extreme.get("scale"), float) else 2.0
    path = _write_log(tmp_path / "run.jsonl", records)
    assert cli.main(["summary", str(path)]) == 0, capsys.readouterr().err
    assert "Traceback" not in capsys.readouterr().err
    assert cli.main(["doctor", "--log", str(path)]) in (0, 1), capsys.readouterr().err
    if HAVE_MPL:
        assert cli.main(["report", str(path)]) == 0, capsys.readouterr().err


# ---- case 15: rich markup in module names ----


MARKUP_NAMES = ["[/bold]", "[red]x[/red]", "a[b]c", ":smile:", "[link=http://x]y[/link]"]


def test_markup_in_module_names_prints_literally(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = []
    for step, name in enumerate(MARKUP_NAMES):
        r = _record(step, skipped=True, name=name)
        records.append(r)
    last = records[-1]
    for name in MARKUP_NAMES:  # the last record holds all names, each in trouble
        last["modules"][name] = dict(last["modules"][MARKUP_NAMES[-1]])
    path = _write_log(tmp_path / "run.jsonl", records)
    assert cli.main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    flat = "".join(out.split())
    for name in MARKUP_NAMES:
        assert "".join(name.split()) in flat, (name, out)


def test_console_tables_print_markup_literally(capsys: pytest.CaptureFixture[str]) -> None:
    from amp_inspect.console import print_table

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        print_table("[bold]title[/bold]", ["[red]module", "n"], [["[/bold]", 1], ["[red]x[/red]", 2]])
    out = capsys.readouterr().out
    for text in ("[bold]title[/bold]", "[red]module", "[/bold]", "[red]x[/red]"):
        assert text in out
