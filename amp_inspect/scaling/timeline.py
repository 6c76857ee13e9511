"""The loss scaler's decisions on the scale timeline: which steps to show, and what each decision was, in words.

``InspectingGradScaler(policy=...)`` with a ScalePolicy makes a ScaleDecision at every update
(amp_inspect/scaling/policies.py): the scale chosen for the next step, why (``reason``), for a skipped step the skip
kind, and the policy's name. The run log carries it as ``"scale_decision"``; a log whose records carry one was
written under that policy (``policy="headroom"`` when the decision names none: logs from before the name was
recorded), any other under GradScaler's own rule (``policy="torch"``). The words for a reason or skip kind are
the policy's (scale_policy's registry, by name); a policy not registered in this process shows them as recorded.
A decision is **shown** on the timeline when it changed the scale, skipped the step, or learned from NaN that a
scale was unsafe (a decision that kept the scale on a clean step otherwise says nothing new).

Torch-free: the summary (diagnosis/history.py), the console, the loss-scale figure (render/plots.py) and the HTML report
share it.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from amp_inspect.core.printable import shown_name
from amp_inspect.scaling.policies import (
    SKIP_NONFINITE,
    HeadroomPolicy,
    ScaleDecision,
    is_routine,
    reason_words,
    skip_words,
)

POLICY_TORCH = "torch"
POLICY_HEADROOM = HeadroomPolicy.name
MAX_SHOWN = 16  # decisions listed one by one; the rest are counted


def scale_text(x: float) -> str:
    """A loss scale as ``2^k (value)`` when it is a power of two, else its value (an int too: Python 3.11's int has
    no is_integer)."""
    x = float(x)
    if not math.isfinite(x) or x <= 0:
        return f"{x:g}"
    k = math.log2(x)
    value = f"{x:,.0f}" if x >= 1 and x.is_integer() else f"{x:g}"
    return f"2^{k:.0f} ({value})" if k.is_integer() else value


def decision_from_record(value: Mapping[str, Any]) -> ScaleDecision:
    """The ScaleDecision of a run-log record's ``"scale_decision"`` (the inverse of ``ScaleDecision.to_record``;
    keys a newer writer added are ignored)."""
    known = {f.name for f in dataclasses.fields(ScaleDecision)}
    fields = {key: item for key, item in value.items() if key in known}
    fields["offenders"] = tuple(fields.get("offenders") or ())
    if not fields.get("policy"):  # written before the name was recorded: the headroom policy's
        fields.pop("policy", None)
    return ScaleDecision(**fields)


def policy_of(decisions: Iterable[ScaleDecision | None]) -> str:
    """The name of the policy whose decision a step carries (the first one's), else POLICY_TORCH."""
    return next((d.policy for d in decisions if d is not None), POLICY_TORCH)


@dataclass(frozen=True)
class ScaleChange:
    """A decision worth showing: it changed the scale after ``step`` or skipped that step."""

    step: int
    decision: ScaleDecision

    # The words of a reason a policy knows, else the log's own string: escaped (printable.shown_name) either way.
    @property
    def reason_text(self) -> str:
        return shown_name(reason_words(self.decision.policy, self.decision.reason))

    @property
    def skip_text(self) -> str:
        skip = self.decision.skip
        return "" if skip is None else shown_name(skip_words(self.decision.policy, skip))

    def __str__(self) -> str:
        d = self.decision
        text = f"step {self.step}: scale {scale_text(d.previous)} -> {scale_text(d.scale)}, {self.reason_text}"
        if d.unsafe_scale is not None:
            text += f" (the NaN/Inf at {scale_text(d.unsafe_scale)} vanished at this step's scale)"
        if d.skip is not None:
            text += f"; skipped: {self.skip_text}"
            if d.skip == SKIP_NONFINITE and d.offenders:
                text += f" ({', '.join(map(shown_name, d.offenders[:3]))}{', ...' if len(d.offenders) > 3 else ''})"
        return text


def scale_changes(steps: Sequence[int], decisions: Sequence[ScaleDecision | None]) -> list[ScaleChange]:
    """The decisions that changed the scale, skipped their step or learned from NaN, in log order."""
    return [
        ScaleChange(int(step), d)
        for step, d in zip(steps, decisions, strict=True)
        if d is not None and (d.skip is not None or d.scale != d.previous or d.unsafe_scale is not None)
    ]


def shown_changes(changes: Sequence[ScaleChange], limit: int = MAX_SHOWN) -> list[ScaleChange]:
    """Up to ``limit`` changes in log order: skips and every reason but the policy's routine moves (plain
    headroom moves) first (those are the decisions a reader looks for), then the routine moves."""

    def routine(d: ScaleDecision) -> bool:
        return d.skip is None and is_routine(d.policy, d.reason)

    ranked = sorted(range(len(changes)), key=lambda i: (routine(changes[i].decision), i))
    return [changes[i] for i in sorted(ranked[:limit])]


def reason_counts(changes: Iterable[ScaleChange]) -> Counter:
    """Reason -> number of shown decisions with it."""
    return Counter(c.decision.reason for c in changes)
