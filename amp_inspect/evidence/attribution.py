"""Who is behind trouble: modules ranked by what their gradients show, and which gradients a rank's NaN/Inf
counts were taken from in a distributed run.

Torch-free: StepReport, the run-log summary and the console share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from amp_inspect.core.printable import shown_name

# Where inf_by_rank's counts were taken: each rank's own gradients before DDP's all-reduce (the rank made
# them), or each rank's FSDP2 shards after the reduce-scatter (the rank owns those elements, whoever made them).
BEFORE_ALLREDUCE = "before_allreduce"
SHARDS = "shards"
ORIGIN_HEADINGS = {
    BEFORE_ALLREDUCE: "ranks behind skipped steps (NaN/Inf in their own gradients, before the all-reduce)",
    SHARDS: "ranks whose gradient shards held the NaN/Inf of skipped steps",
}


def count(module: dict[str, Any], key: str) -> int:
    """A module record's count ``key``, 0 when the record lacks it (a hand-made or foreign log: the log reader
    checks the types of the fields present, not that every field is there)."""
    value = module.get(key, 0)
    return value if isinstance(value, int) else 0


def modules_in_trouble(modules: dict[str, dict[str, Any]]) -> list[str]:
    """Module names with NaN/Inf, overflow, underflow or subnormal gradients (first format), worst first:
    by NaN/Inf count, then overflow, underflow, subnormal."""

    def trouble(name: str) -> tuple[int, ...]:
        m = modules[name]
        bad = count(m, "nan") + count(m, "posinf") + count(m, "neginf")
        return (bad, count(m, "overflow"), count(m, "underflow"), count(m, "subnormal"))

    return sorted((n for n in modules if any(trouble(n))), key=lambda n: tuple(-x for x in trouble(n)))


# ---- where a step's NaN/Inf started ----
#
# Once a NaN appears in backward it flows into every gradient computed after it, so on a skipped step every
# module upstream of the source holds NaN gradients too, often as many as the source itself: counting NaN says
# nothing about where it started. The evidence of the start is the order things ran in. In order of strength:
# the activation hooks' first non-finite producer (when they were armed on that step), else the module whose
# parameters' gradients autograd made first (closest to the output) among those with NaN/Inf: nothing computed
# before it was non-finite, and everything after it may have received its NaN. Logs written before the backward
# order was recorded fall back to the count order, and say so. Backward order is evidence only when something
# computed before the NaN was finite: when every module's gradients held NaN/Inf, the loss itself may have been
# NaN (a forward pass that went non-finite makes every gradient NaN, and the module closest to the output is then
# merely first), so such a step is traced to "the forward pass or the loss", not to a module.

FROM_ACTIVATIONS = "first non-finite output (activation hooks)"
FROM_BACKWARD_ORDER = "closest to the output in backward order"
FROM_COUNT = "most NaN/Inf values (no backward order recorded)"
FROM_EVERY_MODULE = "every module's gradients held NaN/Inf, so the gradients cannot place it (the activation hooks can)"
LOSS_OR_FORWARD = "the forward pass or the loss"  # the origin named for such a step: no module
OVERFLOW_TO_INF = " to Inf ("  # in a finding: the module's arithmetic overflowed its output dtype (activations)
NOT_SEARCHED = "not searched"  # the start of the Inspector's note when armed hooks saw no forward pass


def finding_module(finding: str | None) -> str | None:
    """The module a ``first_nonfinite`` finding names ("blocks.1.fc: forward output went non-finite ..."), or None
    for no finding or the note that the hooks saw nothing."""
    if not finding or finding.startswith(NOT_SEARCHED):
        return None
    module, sep, _ = finding.partition(": ")
    return module if sep else None


def finding_overflowed(finding: str | None) -> str | None:
    """The dtype words of a ``first_nonfinite`` finding whose module's forward output overflowed its own dtype to
    Inf ("h.0.mlp: forward output overflowed fp16 to Inf (32 Inf), step 3" -> "fp16"), else None."""
    if not finding or finding_module(finding) is None:
        return None
    _, _, problem = finding.partition(": ")
    head, sep, _ = problem.partition(OVERFLOW_TO_INF)
    words = head.split()
    return words[-1] if sep and head.startswith("forward output overflowed ") and words else None


def origin_in_order(offenders: Sequence[str], backward_order: Sequence[str]) -> str | None:
    """Among ``offenders``, the module whose gradients autograd computed first (``backward_order``: module names in
    the order their parameters' gradients became ready); modules missing from the order come after, in their own
    order. None without offenders."""
    if not offenders:
        return None
    rank = {m: i for i, m in reversed(list(enumerate(backward_order)))}
    return min(offenders, key=lambda m: (rank.get(m, len(rank)), offenders.index(m)))


def every_module(offenders: Sequence[str], modules: Any) -> bool:
    """Whether the step's NaN/Inf reached the gradients of every module that had gradients: ``modules`` is a step's
    module -> counts (StepReport.by_module, a log record's "modules"); a module with numel 0 held none. False without
    offenders, without module counts (an old or hand-made log: nothing to compare with) and with a single module
    (it is the whole model: naming it says no more than "the forward pass or the loss", and it is what it holds)."""
    if not offenders or not isinstance(modules, dict):
        return False
    held = {str(n) for n, m in modules.items() if not (isinstance(m, dict) and m.get("numel") == 0)}
    return len(held) > 1 and set(offenders) >= held


def step_origin(
    offenders: Sequence[str], first_nonfinite: str | None, origin: str | None, everywhere: bool = False
) -> tuple[str, str] | None:
    """(module, evidence) of where one step's NaN/Inf started; None when nothing held any. ``everywhere``: every
    module's gradients held NaN/Inf (every_module), so without the activation hooks' finding no module is named."""
    found = finding_module(first_nonfinite)
    if found is not None:
        return found, FROM_ACTIVATIONS
    if everywhere and offenders:
        return LOSS_OR_FORWARD, FROM_EVERY_MODULE
    if origin:
        return origin, FROM_BACKWARD_ORDER
    if offenders:
        return offenders[0], FROM_COUNT
    return None


@dataclass
class Blame:
    """Where the NaN/Inf of a set of steps started (see the comment above): ``origins`` counts for each module the
    steps traced to it, ``evidence`` says how each was traced (the strongest evidence seen for it), ``received``
    counts the steps on which a module held NaN/Inf that started elsewhere, ``steps`` is how many steps there were."""

    origins: Counter = field(default_factory=Counter)
    evidence: dict[str, str] = field(default_factory=dict)
    received: Counter = field(default_factory=Counter)
    steps: int = 0

    @property
    def top(self) -> str | None:
        """The top offender: the module most steps' NaN/Inf started in (ties: the first one seen)."""
        return self.origins.most_common(1)[0][0] if self.origins else None

    def shown_top(self, default: str) -> str:
        """The top offender as printed (printable.shown_name), or ``default`` when no step held NaN/Inf."""
        return default if self.top is None else shown_name(self.top)

    def ranked(self, limit: int | None = None) -> list[tuple[str, int]]:
        return self.origins.most_common(limit)

    def tied(self) -> list[str]:
        """The modules tied with the top offender (itself included)."""
        if not self.origins:
            return []
        best = self.origins.most_common(1)[0][1]
        return [m for m, n in self.origins.most_common() if n == best]

    def describe(self, what: str = "skipped steps") -> str:
        """One sentence: where the NaN/Inf started, on how many steps, how we know, ties, and how many modules
        received it."""
        if not self.origins:
            return ""
        parts = []
        for module, n in self.origins.most_common(3):
            parts.append(f"{shown_name(module)} ({n} of {self.steps} {what}; {self.evidence[module]})")
        text = "where the NaN/Inf started: " + ", ".join(parts)
        if len(self.origins) > 3:
            text += f", and {len(self.origins) - 3} more modules"
        tied = self.tied()
        if len(tied) > 1:
            text += f"; {len(tied)} modules tied"
        downstream = [m for m in self.received if m not in self.origins]
        if downstream:
            n = len(downstream)
            text += (
                f"; {n} more module{'s' if n > 1 else ''} upstream received the NaN/Inf (their gradients were "
                "computed after it started)"
            )
        return text


def blame(steps: Iterable[tuple[Any, ...]]) -> Blame:
    """The one ranking of modules behind non-finite steps that every surface shows (the summary, the CLI, the doctor,
    the HTML report, the plots, the integrations, the collapse warning). ``steps``: for each step,
    (offenders, first_nonfinite finding, backward-order origin, whether every module held NaN/Inf) as the history
    and the log hold them."""
    out = Blame()
    strength = (FROM_ACTIVATIONS, FROM_BACKWARD_ORDER, FROM_EVERY_MODULE, FROM_COUNT)
    for offenders, finding, origin, *everywhere in steps:  # a 3-tuple: whether every module held it unknown
        where = step_origin(offenders, finding, origin, bool(everywhere and everywhere[0]))
        if where is None:
            continue
        module, how = where
        out.steps += 1
        out.origins[module] += 1
        known = out.evidence.get(module)
        if known is None or strength.index(how) < strength.index(known):
            out.evidence[module] = how
        out.received.update(m for m in offenders if m != module)
    return out
