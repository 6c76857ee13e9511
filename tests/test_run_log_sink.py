"""run_log_sink.RunLogSink: a step per line, the hardware note once, a failed write warned about once per kind
and never fatal, the file closed when its owner goes."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from amp_inspect.core.tensor_stats import tensor_stats
from amp_inspect.diagnosis.history import StepRecord
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.inspection._log_sink import RunLogSink
from amp_inspect.runlog.log import read_log


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
