"""The run log: strict JSON lines, NaN/Inf round trips, per-line visibility, killed runs, sparse histograms."""

from __future__ import annotations

import errno
import json
import math
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.runlog import log as runlog
from amp_inspect.runlog.log import SCHEMA_VERSION, RunLog, dense_hist, read_log, sparse_hist
from tests.run_logs import log_record, write_log


def _strict_loads(line: str) -> object:
    def reject(constant: str) -> float:
        raise AssertionError(f"non-strict JSON constant {constant!r} in {line!r}")

    return json.loads(line, parse_constant=reject)


def _step_record(step: int, scale: float | None = 65536.0, total_norm: float = 1.5) -> dict:
    return {
        "step": step,
        "scale": scale,
        "skipped": not math.isfinite(total_norm),
        "total_norm": total_norm,
        "offenders": ["inf", "layer.0"] if not math.isfinite(total_norm) else [],
        "headroom": {"up": 3, "down": 12},
        "modules": {
            "layer.0": {"numel": 10, "nan": 1, "posinf": 0, "amax": math.inf, "grad_norm": math.nan},
            "layer.1": {"numel": 4, "nan": 0, "posinf": 0, "amax": 2.5, "grad_norm": -math.inf},
        },
    }


def _same(a: object, b: object) -> bool:
    """Equality that counts NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def test_round_trip_with_nonfinite_floats(tmp_path: Path) -> None:
    records = [_step_record(0), _step_record(1, scale=math.inf, total_norm=math.nan), _step_record(2, scale=None)]
    with RunLog(tmp_path / "run.jsonl") as log:
        for record in records:
            log.write(record)
    got = read_log(tmp_path / "run.jsonl")
    assert len(got) == len(records)
    for record, back in zip(records, got, strict=True):
        assert back["schema"] == SCHEMA_VERSION
        assert isinstance(back["time"], float)
        assert _same({k: v for k, v in back.items() if k not in ("schema", "time")}, record)
    # Only float fields decode: a module called "inf" stays a name.
    assert got[1]["offenders"] == ["inf", "layer.0"]


def test_write_does_not_modify_record_and_keeps_given_schema_and_time(tmp_path: Path) -> None:
    record = {"step": 5, "time": 12.5}
    with RunLog(tmp_path / "run.jsonl") as log:
        log.write(record)
    assert record == {"step": 5, "time": 12.5}
    assert read_log(tmp_path / "run.jsonl") == [{"schema": SCHEMA_VERSION, "time": 12.5, "step": 5}]


def test_every_line_is_strict_compact_json(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log:
        log.write(_step_record(0, scale=-math.inf, total_norm=math.inf))
        log.write({"step": 1, "values": (math.nan, 1.0), "t": torch.tensor([math.inf, 2.0])})
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2
    parsed = [_strict_loads(line) for line in lines]
    assert parsed[0]["scale"] == "-inf" and parsed[0]["total_norm"] == "inf"
    assert parsed[0]["modules"]["layer.0"]["grad_norm"] == "nan"
    assert parsed[1]["values"] == ["nan", 1.0] and parsed[1]["t"] == ["inf", 2.0]
    assert all(", " not in line and ": " not in line for line in lines)


def test_each_line_is_visible_right_after_write(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log, open(path, encoding="utf-8") as reader:
        for step in range(3):
            log.write({"step": step})
            line = reader.readline()
            assert line.endswith("\n")
            assert _strict_loads(line)["step"] == step


def test_fsync_option_writes_the_same(tmp_path: Path) -> None:
    with RunLog(tmp_path / "a" / "b" / "run.jsonl", fsync=True) as log:  # parent dirs are created
        log.write({"step": 0, "scale": math.nan})
    (record,) = read_log(tmp_path / "a" / "b" / "run.jsonl")
    assert record["step"] == 0 and math.isnan(record["scale"])


# The package's face and its run log import no torch: the child starts well under a second.
_KILLED_RUN = textwrap.dedent(
    """
    import os, signal, sys
    from amp_inspect.runlog import log as runlog
    path, n = sys.argv[2], int(sys.argv[3])
    log = runlog.RunLog(path)
    for step in range(n):
        log.write({"step": step, "scale": float("inf") if step % 2 else 1024.0})
    with open(path, "ab") as raw:  # a record torn mid-write
        raw.write(b'{"schema":1,"time":1.0,"step":')
        raw.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL (POSIX)")
def test_killed_run_leaves_readable_log(tmp_path: Path) -> None:
    path, n = tmp_path / "run.jsonl", 5
    proc = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN, runlog.__file__, str(path), str(n)], capture_output=True, timeout=60
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert not path.read_bytes().endswith(b"\n")

    with pytest.warns(RuntimeWarning, match=rf"run\.jsonl: line {n + 1} ") as caught:
        records = read_log(path)
    assert len(caught) == 1
    assert [r["step"] for r in records] == list(range(n))
    assert records[1]["scale"] == math.inf and records[0]["scale"] == 1024.0

    # A resumed run appends to the same log: the torn tail goes, the old records stay, nothing is corrupt.
    with pytest.warns(RuntimeWarning, match="torn last line"), RunLog(path) as log:
        log.write({"step": n})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["step"] for r in read_log(path)] == list(range(n + 1))


def test_reopen_keeps_a_whole_last_record_missing_its_newline(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"schema":1,"step":0}\n{"schema":1,"step":1}')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r["step"] for r in read_log(path)] == [0, 1]
        with RunLog(path) as log:
            log.write({"step": 2})
        assert [r["step"] for r in read_log(path)] == [0, 1, 2]


def test_corrupt_middle_line_is_skipped_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"step":0}\n{"step":1}\n{"step": oops\n{"step":3}\n', encoding="utf-8")
    with pytest.warns(RuntimeWarning, match=r"jsonl: skipped 1 invalid line of 4, read 3 records: line 3 ") as caught:
        assert [r["step"] for r in read_log(path)] == [0, 1, 3]
    assert len(caught) == 1


def test_non_object_middle_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"step":0}\n[1, 2]\n{"step":2}\n', encoding="utf-8")
    with pytest.warns(RuntimeWarning, match=r"line 2 \(expected a JSON object"):
        assert [r["step"] for r in read_log(path)] == [0, 2]


def test_empty_file_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.touch()
    assert read_log(path) == []
    path.write_text('\n{"step":0}\n\n', encoding="utf-8")
    assert read_log(path) == [{"step": 0}]


def test_newer_schema_warns_once_and_is_returned(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log:
        log.write({"step": 0})
        log.write({"schema": SCHEMA_VERSION + 1, "step": 1, "new_field": "x"})
        log.write({"schema": SCHEMA_VERSION + 1, "step": 2})
    with pytest.warns(RuntimeWarning, match="newer") as caught:
        records = read_log(path)
    assert len(caught) == 1
    assert [r["schema"] for r in records] == [SCHEMA_VERSION, SCHEMA_VERSION + 1, SCHEMA_VERSION + 1]
    assert records[1]["new_field"] == "x"


def test_sparse_dense_hist_round_trip() -> None:
    row = torch.zeros(runlog.HIST_BINS, dtype=torch.int64)
    row[0], row[127], row[255] = 7, 3_000_000_000, 1  # a count past 2^31 survives
    sparse = sparse_hist(row)
    assert sparse == {"0": 7, "127": 3_000_000_000, "255": 1}
    assert all(type(c) is int for c in sparse.values())
    assert dense_hist(sparse) == row.tolist()

    as_list = [0] * runlog.HIST_BINS
    as_list[5] = 2
    assert sparse_hist(as_list) == {"5": 2}
    assert dense_hist(sparse_hist(as_list)) == as_list
    assert sparse_hist([0] * runlog.HIST_BINS) == {}
    assert dense_hist({}) == [0] * runlog.HIST_BINS


def test_hist_survives_the_log(tmp_path: Path) -> None:
    row = torch.arange(runlog.HIST_BINS, dtype=torch.int64) % 3
    with RunLog(tmp_path / "run.jsonl") as log:
        log.write({"step": 0, "hist": {"layer.0": sparse_hist(row)}})
    (record,) = read_log(tmp_path / "run.jsonl")
    assert dense_hist(record["hist"]["layer.0"]) == row.tolist()


def test_hist_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match="256 bins"):
        sparse_hist([1, 2, 3])
    with pytest.raises(ValueError, match="outside"):
        dense_hist({"256": 1})


def test_wants_hist(tmp_path: Path) -> None:
    with RunLog(tmp_path / "a.jsonl", hist_every=10) as log:
        assert [s for s in range(35) if log.wants_hist(s)] == [0, 10, 20, 30]
    with RunLog(tmp_path / "b.jsonl") as log:
        assert log.wants_hist(0) and log.wants_hist(200) and not log.wants_hist(150)
    for off in (0, -5):
        with RunLog(tmp_path / "c.jsonl", hist_every=off) as log:
            assert not any(log.wants_hist(s) for s in range(20))


def test_write_after_close_raises(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run.jsonl")
    assert not log.closed
    log.close()
    log.close()  # twice is harmless
    assert log.closed
    with pytest.raises(ValueError, match="closed"):
        log.write({"step": 0})
    with RunLog(tmp_path / "other.jsonl") as ctx:
        pass
    assert ctx.closed


def test_unserialisable_record_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log:
        with pytest.raises(TypeError):
            log.write({"step": 0, "bad": object()})
        log.write({"step": 1})
    assert [r["step"] for r in read_log(path)] == [1]


def test_append_keeps_old_lines(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log:
        log.write({"step": 0})
        log.write({"step": 1})
    with RunLog(path) as log:
        log.write({"step": 2})
    assert [r["step"] for r in read_log(path)] == [0, 1, 2]
    assert len(path.read_text(encoding="utf-8").splitlines()) == 3


def test_a_log_under_the_home_folder_is_written_there(tmp_path, monkeypatch) -> None:
    """log="~/runs/x.jsonl" means the home folder, as in a shell: never a new folder literally named "~"."""
    import torch

    import amp_inspect

    home = tmp_path / "home"
    (home / "runs").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Linear(4, 4)
    insp = amp_inspect.attach(model, log="~/runs/x.jsonl")
    model(torch.randn(2, 4)).sum().backward()
    insp.check()
    insp.detach()
    assert not (tmp_path / "~").exists()
    assert [r["step"] for r in amp_inspect.read_log("~/runs/x.jsonl")] == [0]


def test_a_log_write_that_fails_costs_that_line_only(tmp_path, monkeypatch) -> None:
    """A full disk while training goes on: check() does not raise, history and listeners get every step, one
    warning names the file, and the steps after it are written again (the torn line is skipped on reading)."""
    import errno

    import torch

    import amp_inspect
    from amp_inspect.runlog.log import RunLog

    model = torch.nn.Linear(4, 4)
    insp = amp_inspect.attach(model, log=tmp_path / "run.jsonl")
    heard: list[int] = []
    insp.add_listener(lambda report: heard.append(report.step))
    real_write_all = RunLog._write_all

    def disk_full_on_steps_1_and_2(self: RunLog, line: bytes) -> None:
        if b'"step":1,' in line or b'"step":2,' in line:
            self._file.write(line[:10])  # a part of the line reached the disk
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write_all(self, line)

    monkeypatch.setattr(RunLog, "_write_all", disk_full_on_steps_1_and_2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(4):
            model(torch.randn(2, 4)).sum().backward()
            insp.check()
    insp.detach()
    messages = [str(w.message) for w in caught if "run log" in str(w.message)]
    assert len(messages) == 1 and "No space left on device" in messages[0] and "run.jsonl" in messages[0]
    assert [r.step for r in insp.history] == [0, 1, 2, 3]
    assert heard == [0, 1, 2, 3]
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert [r["step"] for r in amp_inspect.read_log(tmp_path / "run.jsonl")] == [0, 3]


# ---- log= at a file that is not a run log, and torn or bad lines ----


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
    ours = write_log(tmp_path / "run.jsonl", [log_record(0)])
    with open(ours, "ab") as f:
        f.write(b'{"schema":1,"time":1.0,"st')  # a killed run's torn tail
    with pytest.warns(RuntimeWarning, match="torn last line"), RunLog(ours) as log:
        log.write(log_record(1))
    assert [r["step"] for r in read_log(ours)] == [0, 1]
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    with RunLog(empty) as log:
        log.write(log_record(0))
    assert [r["step"] for r in read_log(empty)] == [0]


def test_a_file_blank_for_its_first_64_mib_is_refused_untouched(tmp_path: Path) -> None:
    # Before: judged a blank log after a quadratic scan (96 s), its last line cut and records appended.
    path = tmp_path / "notes.txt"
    path.write_bytes(b" \n" * (runlog._MAX_FIRST_LINE // 2) + b"notes\nthe last line has no newline")
    before = path.read_bytes()
    with pytest.raises(ValueError, match="exists and is not an amp_inspect run log"):
        RunLog(path)
    assert path.read_bytes() == before


def test_blank_lines_before_a_log_or_in_a_blank_file_are_still_appended_after(tmp_path: Path) -> None:
    padded = write_log(tmp_path / "run.jsonl", [log_record(0)])
    padded.write_bytes(b"\n \t\n" * (1 << 18) + padded.read_bytes())  # 1 MiB of blank lines first
    blank = tmp_path / "blank.jsonl"
    blank.write_bytes(b" \n" * (1 << 18))
    for path in (padded, blank):
        with RunLog(path) as log:
            log.write(log_record(1))
    assert [r["step"] for r in read_log(padded)] == [0, 1]
    assert [r["step"] for r in read_log(blank)] == [1]


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
    log.write(log_record(0))
    log.write(log_record(1))
    real = log._file
    log._file = _DiskFull(real)
    with pytest.raises(OSError, match="No space"):
        log.write(log_record(2))
    log._file = real
    log.write(log_record(3))
    log.write(log_record(4, skipped=True))
    log.close()
    with pytest.warns(RuntimeWarning, match=r"run\.jsonl: skipped 1 invalid line of 5, read 4 records: line 3 ") as w:
        records = read_log(path)
    assert len(w) == 1
    assert [r["step"] for r in records] == [0, 1, 3, 4]
    assert records[-1]["skipped"] is True


def test_glued_record_after_a_torn_one_is_recovered(tmp_path: Path) -> None:
    # What an older writer left after a failed write: the next record glued onto the torn line.
    path = write_log(tmp_path / "run.jsonl", [log_record(0)])
    line = json.dumps({"schema": 1, "step": 2}, separators=(",", ":")).encode()
    with open(path, "ab") as f:
        f.write(b'{"schema":1,"time":1.0,"step":1,"sca' + line + b"\n")
    with pytest.warns(RuntimeWarning, match=r"line 2 \(torn, followed by a whole record\)"):
        assert [r["step"] for r in read_log(path)] == [0, 2]


def test_integers_of_float_fields_are_floats_and_numbers_beyond_float_range_skip_the_record(tmp_path: Path) -> None:
    """Before: jq's 32768 for 32768.0 crashed summary (AttributeError: 'int' object has no attribute 'is_integer');
    10**400, Infinity and 1e400 crashed summary, doctor, updates, readiness and report with OverflowError."""
    path = write_log(tmp_path / "run.jsonl", [log_record(0), log_record(1)])
    lines = path.read_text(encoding="utf-8").splitlines()
    jq = lines[0].replace('"scale":1024.0', '"scale":1024')
    bad = [
        lines[1].replace('"total_norm":1.0', f'"total_norm":{token}')
        for token in ("1" + "0" * 400, "Infinity", "1e400")
    ]
    path.write_text("\n".join([jq, *bad, lines[1]]) + "\n", encoding="utf-8")
    with pytest.warns(RuntimeWarning, match=r"skipped 3 invalid lines of 5.*total_norm.*beyond float range"):
        records = read_log(path)
    assert [r["step"] for r in records] == [0, 1]
    assert type(records[0]["scale"]) is float and records[0]["scale"] == 1024.0
    assert records[0]["modules"]["layer"]["numel"] == 10 and type(records[0]["modules"]["layer"]["numel"]) is int
