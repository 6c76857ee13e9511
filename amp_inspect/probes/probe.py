"""The one protocol every probe and link of an inspector follows, so that the Inspector drives them in one loop.

A probe watches the training while it runs (the activation hooks, the readiness hooks, the optimizer watch); a
link ties the inspector to something it did not make (the step context's hooks, the DDP comm hook, the run log's
hardware samples). Each adds its part to a step's report, and each is told when a step ends and when the
inspector detaches. It returns its part as ``{field: value}`` (fields of gradients.step_report.ANNOTATIONS) and
the Inspector hands it to ``StepReport.annotate``: the one place a report is enriched after it is made.

Adding one: a class with these three methods, constructed in ``Inspector.__init__`` and appended to its
``probes`` list (inspection/inspector.py). The order of that list is the order the parts are asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from amp_inspect.gradients.step_report import StepReport

ReportParts = Mapping[str, Any]  # {field of StepReport's ANNOTATIONS: value}; {} when it has nothing to add
NOTHING: ReportParts = {}


class Probe(Protocol):
    def annotate(self, report: StepReport) -> ReportParts:
        """Its part of ``report``, as the inspector takes the report in (inspected, or handed over by an
        InspectingGradScaler). No host sync."""
        ...

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool) -> ReportParts:
        """The step before ``next_step`` ended (``report``: the last report made, None before one;
        ``optimizer_done``: at scaler.update(), the step's optimizer steps ran or were skipped). Its part of
        ``report`` when it has one for that report's step."""
        ...

    def close(self) -> None:
        """Removes its hooks and patches for good (detach). Idempotent."""
        ...


def annotate_all(probes: list[Probe], report: StepReport) -> None:
    """Each probe's part of ``report``, asked in order, into the report."""
    for probe in probes:
        report.annotate(probe.annotate(report))


def end_step_all(probes: list[Probe], next_step: int, report: StepReport | None, optimizer_done: bool) -> None:
    """The end of a step told to each probe in order; each part into ``report`` (a part without a report is
    a probe's mistake: it keeps what has no report yet itself)."""
    for probe in probes:
        parts = probe.end_step(next_step, report, optimizer_done)
        if parts:
            if report is None:
                raise RuntimeError(f"{type(probe).__name__}.end_step returned a part without a report")
            report.annotate(parts)


def close_all(probes: list[Probe]) -> None:
    """Every probe closed, in reverse order of registration (the last hooked is the first removed)."""
    for probe in reversed(probes):
        probe.close()
