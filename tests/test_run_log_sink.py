"""run_log_sink.RunLogSink: a step per line, the hardware note once, a failed write warned about once per kind
and never fatal, the file closed when its owner goes, its pending steps written first (update_every's last)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.core.tensor_stats import tensor_stats
from amp_inspect.diagnosis.history import StepRecord
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.inspection._log_sink import RunLogSink
from amp_inspect.runlog.log import read_log
from tests.models import REPO


class Owner:
    pass


def _step(step: int) -> tuple[StepReport, StepRecord]:
    report = StepReport(step, tensor_stats([torch.ones(3)]), ["m"], None)
    return report, StepRecord.from_report(report)


def test_steps_are_written_one_per_line(tmp_path) -> None:
    owner = Owner()  # alive while the sink writes: its end closes the log
    sink = RunLogSink(tmp_path / "run.jsonl", 1, owner)
    for step in range(2):
        sink.write(*_step(step), None)
    sink.close()
    sink.close()  # idempotent
    assert [r["step"] for r in read_log(tmp_path / "run.jsonl") if "step" in r] == [0, 1]


def test_a_failed_write_is_warned_about_once_and_training_goes_on(tmp_path) -> None:
    owner = Owner()
    sink = RunLogSink(tmp_path / "run.jsonl", 1, owner)

    def full(entry) -> None:
        raise OSError(28, "No space left on device")

    sink.log.write = full
    with pytest.warns(RuntimeWarning, match="could not write step 0 .*No space left on device"):
        sink.write(*_step(0), None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sink.write(*_step(1), None)  # the same error again: not warned twice
    sink.close()


def test_the_log_closes_when_its_owner_is_dropped(tmp_path) -> None:
    owner = Owner()
    sink = RunLogSink(tmp_path / "run.jsonl", 1, owner)
    sink.write(*_step(0), None)
    log = sink.log
    del owner
    gc.collect()
    assert log.closed


def _steps_without_close(path, update_every: int | None) -> object:
    """Three steps of a loop that never calls close(), check() before optimizer.step(); the inspector returned."""
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    options = {"optimizer": opt, "update_every": update_every} if update_every else {}
    insp = amp_inspect.attach(model, log=path, **options)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        insp.check()
        opt.step()
    return insp


@pytest.mark.parametrize("update_every", [None, 1])
def test_a_dropped_inspector_writes_its_pending_steps(tmp_path, update_every) -> None:
    # update_every's last step waited for the next step's end, which never came: its line was lost (2 of 3).
    path = tmp_path / "run.jsonl"
    insp = _steps_without_close(path, update_every)
    del insp
    gc.collect()
    records = read_log(path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(("update" in r) == bool(update_every) for r in records)


_SCRIPT = """
import sys
from tests.test_run_log_sink import _steps_without_close
insp = _steps_without_close(sys.argv[1], int(sys.argv[2]) or None)
"""


@pytest.mark.parametrize("update_every", [0, 1])
def test_a_script_that_ends_without_close_writes_every_step(tmp_path, update_every) -> None:
    path = tmp_path / "run.jsonl"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", _SCRIPT, str(path), str(update_every)], check=True, cwd=REPO, env=env)
    records = read_log(path)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[-1].get("update", {}).get("modules", {}) if update_every else "update" not in records[-1]
