"""Whether the weights themselves were NaN/Inf: what one pass over the parameters found, as a typed, torch-free
record (probes/weight_watch.py measures it; the report, the run log and the incident timeline carry it).

Once the weights hold NaN/Inf, every later forward pass and gradient is NaN/Inf too: those steps are consequences,
not new origins. So the weights are read right after a step whose gradients held NaN/Inf (never on healthy steps:
the pass costs one read of the parameters), and the record says which step's forward pass used the weights read
(``into_step``): a step's weights are the ones its optimizer step left behind at the step before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from amp_inspect.core.printable import plural, shown_name

MAX_NAMED = 5  # modules named in one sentence before "and N more"


@dataclass(frozen=True)
class WeightsSeen:
    """One read of the parameters: ``into_step`` the step whose forward pass used them (the read came after the
    optimizer step of ``into_step - 1``, or before the optimizer step of ``into_step``), ``nonfinite`` module ->
    NaN/Inf parameter elements, most first; empty when every weight was finite. ``partial``: why the read covers
    only this rank's pieces (sharded parameters), "" when it covers every weight."""

    into_step: int
    nonfinite: Mapping[str, int] = field(default_factory=dict)
    partial: str = ""

    @property
    def finite(self) -> bool:
        return not self.nonfinite

    @property
    def total(self) -> int:
        return sum(self.nonfinite.values())

    def modules(self, limit: int = MAX_NAMED) -> str:
        """The modules with non-finite weights, as printed ("a, b and 3 more")."""
        names = list(self.nonfinite)
        shown = ", ".join(shown_name(n) for n in names[:limit])
        return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"

    def describe(self) -> str:
        """One line for a step report."""
        if self.finite:
            return f"weights going into step {self.into_step}: all finite"
        return (
            f"weights going into step {self.into_step}: {plural(self.total, 'NaN/Inf element')} in the parameters "
            f"of {plural(len(self.nonfinite), 'module')} ({self.modules()})"
        )

    def to_record(self) -> dict[str, Any]:
        record: dict[str, Any] = {"into_step": self.into_step, "nonfinite": dict(self.nonfinite)}
        if self.partial:
            record["partial"] = self.partial
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> WeightsSeen:
        """From a run-log record's "weights" (runlog/log.py checks its types when it reads the line)."""
        counts = {str(m): int(n) for m, n in record.get("nonfinite", {}).items()}
        return cls(int(record["into_step"]), counts, str(record.get("partial", "")))
