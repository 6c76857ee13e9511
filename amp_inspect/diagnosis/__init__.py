"""Verdicts over a run: the history of steps and its summary (history.py: scale events, the collapse warning,
advice), the typed findings and their registry (findings.py), the checks of a setup and an environment, and
``doctor()`` (doctor.py). Reads every lower floor; rendered by render/, the CLI and the integrations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.diagnosis.findings import DoctorReport, Finding, check, environment_check
    from amp_inspect.diagnosis.history import StepRecord, Summary

_MODULE_OF = {
    "StepRecord": "history",
    "Summary": "history",
    "Finding": "findings",
    "DoctorReport": "findings",
    "check": "findings",
    "environment_check": "findings",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
