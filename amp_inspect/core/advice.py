"""One line of advice with the facts it is filed by: the unit a run summary's advice is made of.

An ``Advice`` is the text every surface prints ("what the run shows: what to do") and, beside it, what the doctor
files it under (``code``, ``severity``) and what it rests on (``steps``, ``modules``). The producer decides these
once (diagnosis/history.py, a policy's ``advice``, updates/report.py's verdicts); the doctor, ``--json`` and the
integrations read the fields, never the text back. It is a ``str``, so a surface that prints or compares advice
lines keeps working, and a loss-scale policy of one's own may still return plain strings (the doctor files those as
``scaler-advice``)."""

from __future__ import annotations

from collections.abc import Iterable

SCALER_ADVICE = "scaler-advice"  # the doctor's code for advice about the loss scaler's settings


class Advice(str):
    """Advice text with its typed facts (see the module docstring)."""

    seen: str  # what the run shows
    action: str  # what to do ("" when the line is a fact only)
    code: str  # the doctor's finding code
    severity: str  # "error", "warning" or "info"
    steps: tuple[int, ...]  # the steps it rests on
    modules: tuple[str, ...]  # the modules it is about

    def __new__(
        cls,
        seen: str,
        action: str = "",
        *,
        code: str = SCALER_ADVICE,
        severity: str = "info",
        steps: Iterable[int] = (),
        modules: Iterable[str] = (),
    ) -> Advice:
        self = super().__new__(cls, f"{seen}: {action}" if action else seen)
        self.seen, self.action, self.code, self.severity = seen, action, code, severity
        self.steps, self.modules = tuple(steps), tuple(modules)
        return self
