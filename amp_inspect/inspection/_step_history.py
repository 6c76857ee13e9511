"""An inspector's reports on their way to the history: held until their statistics are on the host (one step
behind on CUDA, no sync), then finalized in step order into StepRecords, handed to whoever follows them (the
run log, the activation arming, the user's listeners), and checked for a collapsing loss scale.

Per-module norms (a loop over the rows) are kept where the log writes them anyway, or on a gradient spike, with
the step before's (kept as its report): the summary names the modules whose norm rose most. Reading ``records``
from another thread while the training thread collects is safe: one lock finalizes each report once.
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Callable

from amp_inspect.diagnosis.history import RECENT_STEPS, StepRecord, collapse_warning
from amp_inspect.gradients.step_report import StepReport

Follower = Callable[[StepReport, StepRecord], None]


class StepHistory:
    """The finalized StepRecords of one inspector, and its reports still on their way to the host.

    ``follow`` (given to ``collect``: held by no one, so no cycle back to the inspector) is called with
    (report, record) for each finalized step, in order, before the user's ``listeners`` (called with the
    report); every record keeps its per-module gradient norms (what a spike's modules are judged against)."""

    def __init__(self, collapse_skips: int) -> None:
        self.collapse_skips = collapse_skips
        self.listeners: list[Callable[[StepReport], None]] = []
        self._pending: deque[StepReport] = deque()
        self._records: list[StepRecord] = []
        self._warned_collapse = False
        self._lock = threading.RLock()

    def add(self, report: StepReport) -> None:
        """A report whose statistics may still be on their way to the host; it learns the recommended scales of
        the recent finalized steps (no sync): str(report) shows their median beside its own recommendation."""
        report.annotate({"recent_recommended": self.recent_recommended()})
        self._pending.append(report)

    def recent_recommended(self) -> list[float]:
        """The recommended scales of the recent finalized steps not skipped (no sync)."""
        recent = [r.recommended_scale for r in self._records[-(RECENT_STEPS - 1) :] if not r.skipped]
        return [x for x in recent if x]

    def collect(self, wait: bool, follow: Follower, *, keep_open: bool = False) -> None:
        """Finalizes the reports whose copies are complete (all of them with ``wait``: that waits for the device;
        with ``keep_open`` not from a step whose measured optimizer step has yet to run, update_every's)."""
        with self._lock:  # another thread reading records must not finalize the same report twice
            while self._pending and (wait or self._pending[0].ready()):
                if keep_open and self._pending[0].optimizer_step_pending:
                    break  # its log line would go without what its optimizer step did
                self._finalize(self._pending.popleft(), follow)

    def records(self, follow: Follower) -> list[StepRecord]:
        """One StepRecord per step (waits for outstanding device copies); a step measured by update_every with finite
        gradients joins once its optimizer step ran (read between check() and optimizer.step(), the history ends
        before it), so that its log line carries what the step did."""
        self.collect(True, follow, keep_open=True)
        return list(self._records)

    def _finalize(self, report: StepReport, follow: Follower) -> None:
        record = StepRecord.from_report(report)
        self._records.append(record)
        follow(report, record)
        for listener in self.listeners:
            listener(report)
        message = collapse_warning(self._records, self.collapse_skips)
        if message and not self._warned_collapse:
            warnings.warn(f"amp_inspect: {message}", RuntimeWarning, stacklevel=4)
        self._warned_collapse = message is not None
