"""Where an inspector's finalized steps go on disk: the run log (runlog/log.py), with exponent histograms on the
steps inspection/_hist_schedule.py picks and the hardware note once, on the first line written.

A line that cannot be written (disk full, a network file system gone) costs that line, never the training run,
the history or the listeners: one warning per kind of error, and the next step tries again (RunLog starts it on
a fresh line, and read_log skips the torn one). A run that ends without close() still closes its log at exit or
when its inspector is dropped (no ResourceWarning), and first writes the steps still pending: a step update_every
measures waits for its optimizer step's statistics until the next step's end, which a script's last step never
reaches.
"""

from __future__ import annotations

import os
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from amp_inspect.diagnosis.history import StepRecord
from amp_inspect.distributed.combine import log_path_of_rank
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.inspection._hist_schedule import HistogramSchedule
from amp_inspect.inspection._step_history import StepHistory
from amp_inspect.model.view import ModelView
from amp_inspect.runlog import hardware
from amp_inspect.runlog.log import RunLog


class RunLogSink:
    """One inspector's run log at ``path``; ``owner`` is the inspector, whose end (garbage, or the interpreter's
    exit) writes the steps of ``steps`` still pending, then closes the file. ``device`` says the device of the
    model's first parameter (for the hardware note of the first line); neither may hold the owner."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        hist_every: int,
        owner: object,
        steps: StepHistory | None = None,
        device: Callable[[], torch.device | None] = lambda: None,
    ) -> None:
        self.log = RunLog(path, hist_every=hist_every)
        self._hists = HistogramSchedule(hist_every)  # regular steps, and those of an incident
        self._steps, self._device = steps, device
        self._closer = weakref.finalize(owner, self._end)  # holds the sink, not the owner
        self._hardware_note_written = False
        self._error: str | None = None  # the last failed write, warned about once per error kind

    @classmethod
    def of_rank(
        cls,
        log: str | os.PathLike[str] | None,
        all_ranks: bool,
        group: Any,
        hist_every: int,
        owner: object,
        steps: StepHistory | None = None,
        device: Callable[[], torch.device | None] = lambda: None,
    ) -> RunLogSink | None:
        """This rank's sink for the ``log=`` option (distributed.log_path_of_rank: in a distributed run the first
        rank of ``group`` writes, or every rank its own file with ``all_ranks``); None where this rank writes none."""
        path = log_path_of_rank(log, all_ranks, group) if log is not None else None
        return cls(path, hist_every, owner, steps, device) if path is not None else None

    def hardware_samples(self, view: ModelView) -> HardwareSamples:
        """The link (a Probe) that gives each report the memory of its step, for its line written later."""
        return HardwareSamples(view)

    def write(self, report: StepReport, record: StepRecord, device: torch.device | None) -> None:
        """Writes the step of ``report`` (``record`` its history entry) as one line; the first line carries the
        hardware note of ``device``."""
        wants = self._hists.wants(report.step, skipped=record.skipped or record.poisoned, total_norm=record.total_norm)
        entry = report.to_record(with_hist=wants)
        entry["hardware"] = report.hardware
        if not self._hardware_note_written:
            self._hardware_note_written = True
            note = hardware.note(device)
            if note:
                entry["hardware_note"] = note
        self._write(entry)

    def _write(self, entry: dict[str, Any]) -> None:
        try:
            self.log.write(entry)
        except OSError as error:
            message = f"{type(error).__name__}: {error.strerror or error}"
            if message != self._error:
                warnings.warn(
                    f"amp_inspect: could not write step {entry.get('step')} to the run log {self.log.path} "
                    f"({message}); training and inspection go on, and later steps are written again when the file "
                    "takes them.",
                    RuntimeWarning,
                    stacklevel=6,  # the caller of check(), scaler.update() or history
                )
            self._error = message
        else:
            self._error = None

    def close(self) -> None:
        """Closes the file (idempotent); nothing is written after."""
        self.log.close()
        self._closer.detach()

    def _end(self) -> None:
        """The owner's end without close(): its pending steps written (as close() would), then the file closed."""
        try:
            if self._steps is not None and not self.log.closed:
                self._steps.collect(True, lambda report, record: self.write(report, record, self._device()))
        finally:
            self.log.close()


class HardwareSamples:
    """The run log's link on each report (the Probe protocol, probes/probe.py): memory etc. of the device of the
    model's first parameter, sampled as the report is taken in (no sync)."""

    def __init__(self, view: ModelView) -> None:
        self.view = view

    def annotate(self, report: StepReport) -> dict[str, Any]:
        return {"hardware": hardware.sample(self.view.device)}

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool = False) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Nothing hooked: the log itself is closed by the inspector's close()."""
