"""Which steps' log records carry per-module exponent histograms: the regular ones, and those of an incident.

Regular: every step divisible by ``hist_every`` (RunLog.wants_hist). Incident: a skipped (or poisoned) step and
a **spike** step (as amp_inspect.evidence.spikes defines it: the one definition the summary and the doctor use too),
each with the ``AFTER_SKIP`` steps after it. At most ``MAX_INCIDENT_HISTS`` incident histograms per run (a run that
skips every step keeps a bounded log: 50 more records of 256 bins per module). The step before a skip is not among
them: its record is written before the skip is known (a gap the regular steps cover).
``hist_every=0`` turns all of them off.

Plain host arithmetic on what the history already holds; torch-free.
"""

from __future__ import annotations

import math
from collections import deque

from amp_inspect.evidence.spikes import SPIKE_WINDOW, is_spike

AFTER_SKIP = 2
MAX_INCIDENT_HISTS = 50


class HistogramSchedule:
    """Decides, step by step in log order, whether a record carries histograms (see the module docstring)."""

    def __init__(self, hist_every: int, max_incident: int = MAX_INCIDENT_HISTS) -> None:
        self.hist_every = hist_every
        self.max_incident = max_incident
        self.incident_hists = 0  # incident histograms written so far
        self._after = 0  # steps still to record after the last skip
        self._norms: deque[float] = deque(maxlen=SPIKE_WINDOW)

    def regular(self, step: int) -> bool:
        return self.hist_every > 0 and step % self.hist_every == 0

    def spike(self, total_norm: float) -> bool:
        """Whether ``total_norm`` is a spike against the finite norms seen so far (and remembers it)."""
        if not math.isfinite(total_norm):
            return False
        jumped = is_spike(total_norm, list(self._norms)) is not None
        self._norms.append(total_norm)
        return jumped

    def wants(self, step: int, *, skipped: bool, total_norm: float) -> bool:
        """Whether the record of ``step`` (skipped or applied with NaN/Inf: ``skipped``) carries histograms."""
        spiked = self.spike(total_norm) if not skipped else False
        incident = skipped or spiked or self._after > 0
        self._after = AFTER_SKIP if skipped or spiked else max(self._after - 1, 0)
        if self.hist_every <= 0:
            return False
        if self.regular(step):
            return True
        if incident and self.incident_hists < self.max_incident:
            self.incident_hists += 1
            return True
        return False
