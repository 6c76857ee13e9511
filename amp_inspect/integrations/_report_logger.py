"""What the TensorBoard and W&B loggers share: which steps get scalars and which get exponent histograms,
the tags they are written under, following an Inspector, and flushing it. Each logger only says how it writes
(amp_inspect/integrations/tensorboard.py, wandb.py). Imports no optional package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

import numpy as np

from amp_inspect.integrations._common import (
    PREFIX,
    check_every,
    exponent_edges,
    exponent_span,
    on_finalized,
    report_values,
)

if TYPE_CHECKING:
    from typing_extensions import Self

    from amp_inspect.gradients.step_report import StepReport
    from amp_inspect.inspection.inspector import Inspector


class ReportLogger(ABC):
    """A logger of StepReports: its step intervals and the Inspector it follows; a subclass writes what
    ``tagged_values`` gives in its ``log(report)``.

    Args:
        log_every: scalars for reports whose step is divisible by N.
        hist_every: exponent histograms for reports whose step is divisible by N; 0 turns them off.
        top_modules: at most this many modules get per-module values and histograms.
    """

    def __init__(self, *, log_every: int, hist_every: int, top_modules: int) -> None:
        self.log_every = check_every("log_every", log_every)
        self.hist_every = check_every("hist_every", hist_every, allow_zero=True)
        self.top_modules = check_every("top_modules", top_modules, allow_zero=True)
        self._inspector: Inspector | None = None

    @abstractmethod
    def log(self, report: StepReport) -> None:
        """Writes one report (what ``tagged_values`` gives for it)."""

    def attach(self, inspector: Inspector) -> Self:
        """Logs every report ``inspector`` finalizes from now on (no host sync); returns self."""
        on_finalized(inspector, self.log)
        self._inspector = inspector
        return self

    def tagged_values(self, report: StepReport) -> tuple[dict[str, float], dict[str, tuple[np.ndarray, np.ndarray]]]:
        """What to write for ``report``: ({tag: scalar}, {tag: (counts, edges)}), both empty on steps that
        neither ``log_every`` nor ``hist_every`` divides. A histogram holds the span of nonzero exponent bins
        (counts as in the report, one more edge than counts); an empty one is left out.

        Reads the report's values: waits for its device copies on CUDA unless ``report.ready()``."""
        step = report.step
        wants_scalars = step % self.log_every == 0
        wants_hist = self.hist_every > 0 and step % self.hist_every == 0
        if not (wants_scalars or wants_hist):
            return {}, {}
        scalars, hists = report_values(
            report, scalars=wants_scalars, histograms=wants_hist, top_modules=self.top_modules
        )
        histograms = {}
        for name, hist in hists.items():
            span = exponent_span(hist)
            if span is not None:
                first, last = span
                histograms[f"{PREFIX}exponent/{name}"] = (hist[first : last + 1], exponent_edges(first, last))
        return {PREFIX + key: value for key, value in scalars.items()}, histograms

    def flush(self) -> None:
        """Logs the attached inspector's reports still in flight (waits for them)."""
        if self._inspector is not None:
            self._inspector.history  # noqa: B018  # reading it finalizes (and so logs) outstanding reports
