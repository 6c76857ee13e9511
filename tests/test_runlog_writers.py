"""The run log with several writers, other people's files and odd paths (issue 18, cases 1-4, 11, 12).

- One writer per file: a second RunLog on the same file (another process, another inspector in this process,
  a symlink) is refused with LogInUseError and changes nothing; the first writer loses nothing.
- A file is ours only when its first line names this writer and its schema version (or is a whole valid
  record of schema 1, as logs were written before the name): another tool's JSONL starting ``{"schema":`` is
  refused byte-identical.
- A log deleted while the run goes on is said once.
- A FIFO, a device, a parent path that is a file: one-sentence ValueError, nothing blocks.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from amp_inspect.runlog import log as runlog
from amp_inspect.runlog.log import LogInUseError, RunLog, is_run_log, read_log

needs_posix = pytest.mark.skipif(runlog.fcntl is None or not hasattr(os, "mkfifo"), reason="needs POSIX locks")

# Writer A: big records (about 1 MB, so one write(2) takes long enough for a reader to catch it half-done), a
# marker file once the log is open, then N records.
_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from amp_inspect.runlog.log import RunLog
    import time
    path, ready, n, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    go = Path(ready + ".go")
    with RunLog(path) as log:
        Path(ready).touch()
        while not go.exists():  # the test has seen the log held once
            time.sleep(0.01)
        for step in range(n):
            log.write({"step": step, "pad": "x" * size})
    """
)

# Holds a RunLog open (first line written) until killed.
_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from amp_inspect.runlog.log import RunLog
    log = RunLog(sys.argv[1])
    log.write({"step": 0})
    Path(sys.argv[2]).touch()
    time.sleep(120)
    """
)


def _start(code: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(runlog.__file__).parents[1])}
    return subprocess.Popen([sys.executable, "-c", code, *args], env=env, stderr=subprocess.PIPE)


def _wait_for(marker: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        assert time.monotonic() < deadline, "the child never opened its log"
        time.sleep(0.01)


@needs_posix
def test_a_second_process_opening_the_log_loses_none_of_the_first_ones_records(tmp_path: Path) -> None:
    """Case 1: before, each RunLog(path) in process B cut A's half-written line as "torn": records lost."""
    path, ready, n = tmp_path / "run.jsonl", tmp_path / "ready", 40
    writer = _start(_WRITER, str(path), str(ready), str(n), str(1 << 20))
    _wait_for(ready, writer)
    with pytest.raises(LogInUseError):
        RunLog(path)
    Path(str(ready) + ".go").touch()
    while writer.poll() is None:  # B opens again and again while A writes (before: each open cut A's line)
        try:
            RunLog(path).close()
        except LogInUseError as err:
            assert "another process" in str(err) and "one writer per file" in str(err)
    assert writer.wait(timeout=60) == 0, writer.stderr.read().decode()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not one torn or cut line
        assert [r["step"] for r in read_log(path)] == list(range(n))


@needs_posix
def test_a_log_held_by_another_process_is_refused_untouched_even_on_its_first_line(tmp_path: Path) -> None:
    """Cases 1 and 12: the holder's first line (or half of it) is never judged "not a run log" or cut."""
    path, ready = tmp_path / "run.jsonl", tmp_path / "ready"
    holder = _start(_HOLDER, str(path), str(ready))
    try:
        _wait_for(ready, holder)
        with open(path, "ab") as raw:  # as if the holder's next line were half-way through its write
            raw.write(b'{"schema":1,"log":"amp_inspect","time":1.0,"st')
        before = path.read_bytes()
        with pytest.raises(LogInUseError, match=r"run\.jsonl' is being written by another process"):
            RunLog(path)
        assert path.read_bytes() == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)


def test_our_first_line_caught_before_it_names_the_writer_is_not_foreign(tmp_path: Path) -> None:
    """Case 12: the recognition sees a first line as it lands; a start of ours is ours, and, the lock being
    ours, the torn line is cut."""
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"sche')
    assert is_run_log(path)
    with pytest.warns(RuntimeWarning, match="torn last line"), RunLog(path) as log:
        log.write({"step": 0})
    assert [r["step"] for r in read_log(path)] == [0]


def test_another_tools_jsonl_with_a_schema_field_is_refused_byte_identical(tmp_path: Path) -> None:
    """Case 2: before, any line starting {"schema": was taken for ours: its torn tail cut, our lines appended."""
    path = tmp_path / "data.jsonl"
    path.write_bytes(b'{"schema": "user-data", "rows": [1, 2, 3]}\n{"schema": "user-data", "rows": [4')
    before = path.read_bytes()
    assert not is_run_log(path)
    with pytest.raises(ValueError, match="exists and is not an amp_inspect run log"):
        RunLog(path)
    assert path.read_bytes() == before
    compact = tmp_path / "compact.jsonl"  # the same bytes our writer would start with, another tool's schema
    compact.write_bytes(b'{"schema":7,"time":1.0,"step":0}\n{"schema":7,"ti')
    with pytest.raises(ValueError, match="not an amp_inspect run log"):
        RunLog(compact)


def test_our_lines_name_the_writer_and_read_log_returns_the_records_without_it(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log:
        log.write({"step": 3})
        with pytest.raises(ValueError, match='"log" is the run log'):
            log.write({"step": 4, "log": "mine"})
    assert path.read_bytes().startswith(b'{"schema":1,"log":"amp_inspect","time":')
    assert [set(r) for r in read_log(path)] == [{"schema", "time", "step"}]


def test_a_log_of_a_newer_schema_is_not_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_bytes(b'{"schema":%d,"log":"amp_inspect","time":1.0,"step":0}\n' % (runlog.SCHEMA_VERSION + 1))
    before = path.read_bytes()
    with pytest.raises(ValueError, match="newer amp_inspect"):
        RunLog(path)
    assert path.read_bytes() == before


def test_a_log_written_before_lines_named_the_writer_is_still_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    path.write_bytes(b'{"schema":1,"time":1.0,"step":0}\n{"schema":1,"time":2.0,"st')
    with pytest.warns(RuntimeWarning, match="torn last line"), RunLog(path) as log:
        log.write({"step": 1})
    assert [r["step"] for r in read_log(path)] == [0, 1]


@needs_posix
def test_two_inspectors_on_one_path_in_one_process_the_second_is_refused(tmp_path: Path) -> None:
    """Case 3: before, both wrote: steps [0, 0, 1, 1, ...] in one file, summary counted each twice."""
    import torch

    import amp_inspect

    path = tmp_path / "run.jsonl"
    link = tmp_path / "link.jsonl"
    first_model, second_model = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    first = amp_inspect.attach(first_model, log=path)
    for target in (path, link):
        if target == link:
            link.symlink_to(path)
        with pytest.raises(LogInUseError, match="another RunLog in this process"):
            amp_inspect.attach(second_model, log=target)
    for _ in range(3):
        first_model(torch.randn(2, 4)).sum().backward()
        first.check()
    first.detach()
    assert [r["step"] for r in read_log(path)] == [0, 1, 2]
    second = amp_inspect.attach(second_model, log=link)  # the file is free again once the first detaches
    second.detach()


@needs_posix
def test_a_dropped_runlog_frees_its_file(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    log = RunLog(path)
    log.write({"step": 0})
    del log  # CPython closes the file at once, and with it the lock
    with RunLog(path) as again:
        again.write({"step": 1})
    assert [r["step"] for r in read_log(path)] == [0, 1]


def test_a_log_deleted_while_the_run_goes_on_is_said_once(tmp_path: Path) -> None:
    """Case 3: before, every later record went into the deleted file without a word."""
    path = tmp_path / "run.jsonl"
    with RunLog(path) as log:
        log.write({"step": 0})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            log.write({"step": 1})  # still there: no warning
        path.unlink()
        with pytest.warns(RuntimeWarning, match=r"run\.jsonl was deleted or replaced") as caught:
            for step in range(2, 5):
                log.write({"step": step})
    assert len(caught) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_log_is_refused_without_blocking(tmp_path: Path) -> None:
    """Case 4: before, attach(m, log=<a FIFO>) blocked forever reading it. Run in a child so a regression fails."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = (
        "import sys, torch, amp_inspect\n"
        "try:\n    amp_inspect.attach(torch.nn.Linear(2, 2), log=sys.argv[1])\n"
        "except ValueError as err:\n    print(err)\n"
        "print('is_run_log', amp_inspect.runlog.log.is_run_log(sys.argv[1]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(runlog.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, timeout=300, env=env)
    out = proc.stdout.decode()
    assert "is not a regular file" in out and "log=None" in out, proc.stderr.decode()
    assert "is_run_log False" in out


def test_a_log_whose_parent_is_a_file_is_one_sentence(tmp_path: Path) -> None:
    """Case 11: before, a raw FileExistsError from mkdir."""
    parent = tmp_path / "same.jsonl"
    parent.write_text("x", encoding="utf-8")
    for path in (parent / "x.jsonl", parent / "deeper" / "x.jsonl"):
        with pytest.raises(ValueError, match="a part of its parent path is a file, not a folder"):
            RunLog(path)
    assert parent.read_text(encoding="utf-8") == "x"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_reading_a_fifo_as_a_log_is_refused_without_blocking(tmp_path: Path) -> None:
    """read_log (and so `amp-inspect summary`) on a FIFO with no writer: a sentence, not a hang. In a child, so a
    regression fails on the timeout instead of hanging the suite."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = (
        "import sys, amp_inspect.runlog.log as r\n"
        "try:\n    r.read_log(sys.argv[1])\n"
        "except ValueError as err:\n    print(err)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(runlog.__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, timeout=300, env=env)
    assert "is not a regular file" in proc.stdout.decode(), proc.stderr.decode()
    records = tmp_path / "run.jsonl"  # a regular file still reads
    records.write_text("", encoding="utf-8")
    assert runlog.read_log(records) == []


@needs_posix
def test_without_file_locks_a_second_runlog_in_this_process_is_still_refused(tmp_path: Path, monkeypatch) -> None:
    """Before, with flock failing (ENOLCK: NFS without locks) the second RunLog was accepted and both wrote."""

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(runlog.fcntl, "flock", no_locks)
    path = tmp_path / "run.jsonl"
    with pytest.warns(RuntimeWarning, match="no file locks"):
        first = RunLog(path)
    first.write({"step": 0})
    with pytest.raises(LogInUseError, match="another RunLog in this process"):
        RunLog(tmp_path / "." / "run.jsonl")
    first.close()
    with pytest.warns(RuntimeWarning, match="no file locks"), RunLog(path) as again:  # free once closed
        again.write({"step": 1})
    assert [r["step"] for r in read_log(path)] == [0, 1]


def _forked(child: Callable[[], str]) -> tuple[int, int]:
    """A forked child (as a DataLoader worker is) that sends what ``child()`` says, then sleeps until killed:
    (its pid, the read end of its pipe)."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()": as DataLoader does
        pid = os.fork()
    if pid == 0:
        try:
            os.write(write_end, child().encode())
        finally:
            os.close(write_end)
            time.sleep(120)
            os._exit(0)
    os.close(write_end)
    return pid, read_end


@needs_posix
def test_a_forked_worker_does_not_keep_the_log_locked_after_close(tmp_path: Path) -> None:
    """Before, the worker's copy of the file description kept the lock: after close() (detach), opening the log again
    (the re-run docs/usage.md prescribes) was refused as "another process" while the worker lived."""
    path = tmp_path / "run.jsonl"
    log = RunLog(path)
    log.write({"step": 0})

    def in_worker() -> str:
        try:
            RunLog(path)
        except LogInUseError as err:  # the parent's lock holds while the parent has the log open
            return f"closed={log.closed}; {err}"
        return f"closed={log.closed}; opened"

    pid, said = _forked(in_worker)
    try:
        answer = os.read(said, 4096).decode()  # the worker is running
        log.close()
        with RunLog(path) as again:
            again.write({"step": 1})
        assert [r["step"] for r in read_log(path)] == [0, 1]
        # The worker closed its copy and opens nothing of the parent's, whose lock held while it was open.
        assert answer.startswith("closed=True; ") and "being written by another process" in answer, answer
    finally:
        os.close(said)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
