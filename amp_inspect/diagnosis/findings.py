"""The AMP doctor's findings and its check registry: a ``Finding`` (one problem, with its fix), the
``DoctorReport`` that orders them, and the ``@check`` / ``@environment_check`` decorators that register a check.

Torch-free, so the command line can name the doctor's defaults without loading torch. The checks themselves
live in amp_inspect/diagnosis/setup_checks.py (model, optimizer, scaler, history) and
amp_inspect/diagnosis/environment_checks.py (the machine, the build, a run log's hardware readings);
amp_inspect/diagnosis/doctor.py runs them.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from amp_inspect.core.printable import shown_name

SEVERITIES = ("error", "warning", "info")
MAX_LISTED = 10  # modules or parameters named in one finding before "and N more"
_WRAP_WIDTH = 110


FINDINGS_SCHEMA = "amp_inspect.findings/1"  # the JSON document of --json (docs/usage.md: findings for machines)


@dataclass(frozen=True)
class Finding:
    """One problem (or fact): ``code`` a short stable id, ``severity`` one of SEVERITIES, ``message`` what is
    wrong and where (parameter and module names), ``fix`` how to fix it, with code. Where the finding rests on
    steps of a run, ``steps`` names them and ``modules`` the modules it is about (empty where it is not about
    steps or modules); ``evidence`` holds the typed facts it rests on (JSON values), for machines."""

    code: str
    severity: str
    message: str
    fix: str = ""
    steps: tuple[int, ...] = ()
    modules: tuple[str, ...] = ()
    evidence: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """The finding as one JSON object of the findings document (FINDINGS_SCHEMA)."""
        return {
            "code": self.code,
            "severity": self.severity,
            "message": self.message,
            "action": self.fix,
            "steps": list(self.steps),
            "modules": list(self.modules),
            "evidence": self.evidence,
        }

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def __str__(self) -> str:
        # A message quotes what a log or a model says (a hardware note, a dtype, a module name): printed, every
        # character of it that is no text is escaped, whatever the check that wrote the message escaped itself.
        head = textwrap.fill(
            f"{self.severity.upper()} [{self.code}] {shown_name(self.message, limit=None)}",
            _WRAP_WIDTH,
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        if not self.fix:
            return head
        fix = textwrap.fill(
            f"fix: {shown_name(self.fix, limit=None)}",
            _WRAP_WIDTH,
            initial_indent="    ",
            subsequent_indent="         ",
            break_long_words=False,
        )
        return f"{head}\n{fix}"


@dataclass
class DoctorReport:
    """The findings of one doctor run, errors first. ``ok``: no error and no warning."""

    findings: list[Finding] = field(default_factory=list)
    header: list[str] = field(default_factory=list)  # context lines printed first (what was checked)

    def __post_init__(self) -> None:
        self.findings = sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity))  # stable within a level

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("error", "warning") for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def to_json(self, **extra: Any) -> dict[str, Any]:
        """The findings document (``FINDINGS_SCHEMA``): the verdict, the header, every finding; ``extra`` keys
        (a run's facts) join it."""
        return {
            "schema": FINDINGS_SCHEMA,
            "ok": self.ok,
            "header": list(self.header),
            **extra,
            "findings": [f.to_json() for f in self.findings],
        }

    def __str__(self) -> str:
        counts = Counter(f.severity for f in self.findings)
        parts = [f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}" for s in ("error", "warning") if counts[s]]
        verdict = ", ".join(parts) if parts else "no problems found"
        lines = [
            *self.header,
            f"amp_inspect doctor: {verdict}" + (f" ({counts['info']} notes)" if counts["info"] else ""),
        ]
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)


# ---- the registry ----

# A setup check takes an amp_inspect.diagnosis.setup_checks.Setup (CheckFn there); the registry does not name it, so
# that this module, which every check imports, imports none of them.
SetupCheck = TypeVar("SetupCheck", bound=Callable[[Any], Iterable[Finding]])
CHECKS: list[Callable[[Any], Iterable[Finding]]] = []
ENVIRONMENT_CHECKS: list[Callable[[], Iterable[Finding]]] = []


def check(fn: SetupCheck) -> SetupCheck:
    """Registers a setup check, a function of a ``Setup`` (runs in registration order)."""
    CHECKS.append(fn)
    return fn


def environment_check(fn: Callable[[], Iterable[Finding]]) -> Callable[[], Iterable[Finding]]:
    """Registers an environment check (runs in registration order)."""
    ENVIRONMENT_CHECKS.append(fn)
    return fn


def listing(names: Sequence[str], limit: int = MAX_LISTED) -> str:
    """The first ``limit`` names, then "and N more"."""
    shown = ", ".join(shown_name(n) for n in names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"
