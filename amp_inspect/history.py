"""The run so far: one StepRecord per inspected step, the loss-scale events they imply, and advice.

A **growth** event is a step whose loss scale is larger than at the previous inspected step, a **backoff**
one whose scale is smaller. The **skip rate** is skipped steps / inspected steps. A **collapse** is a loss
scale below 1, or ``collapse_skips`` skipped steps in a row: training has stopped making progress.
A **poisoned** step had NaN/Inf gradients and no enabled GradScaler to skip it: the optimizer applied them.
It is counted apart from skipped steps (no loss-scale advice fits it).

The advice depends on the loss-scale policy the run used (scale_timeline.py: a history whose records carry
ScaleDecisions ran under ``policy="headroom"``): GradScaler's init_scale, growth_interval and backoff_factor
set its scale under ``policy="torch"``; under the headroom policy the measured exponents set it, and the advice
speaks of the policy's decisions instead.

Torch-free, so a run log is summarised without loading torch.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .attribution import BEFORE_ALLREDUCE, ORIGIN_HEADINGS, SHARDS
from .headroom import Headroom
from .printable import shown_name
from .scale_policy import MARGIN, NONFINITE_NOT_FROM_SCALE, SKIP_OVERFLOW, ScaleDecision
from .scale_timeline import (
    POLICY_HEADROOM,
    POLICY_TORCH,
    ScaleChange,
    decision_from_record,
    policy_of,
    reason_counts,
    scale_changes,
)

if TYPE_CHECKING:
    from .report import StepReport

COLLAPSE_SKIPS = 5  # skipped steps in a row that count as a loss-scale collapse (attach's default)


@dataclass(frozen=True)
class StepRecord:
    step: int
    scale: float | None
    skipped: bool
    offenders: list[str]
    total_norm: float
    headroom: Headroom
    recommended_scale: float | None
    first_nonfinite: str | None = None
    ranks_with_inf: list[int] | None = None  # distributed runs: ranks whose gradients held NaN/Inf
    inf_origin: str | None = None  # which gradients: report.BEFORE_ALLREDUCE (DDP) or report.SHARDS (FSDP2)
    poisoned: bool = False  # NaN/Inf and no enabled GradScaler: the optimizer applied them (never also skipped)
    scale_decision: ScaleDecision | None = None  # InspectingGradScaler(policy="headroom")'s decision after this step

    @classmethod
    def from_report(cls, report: StepReport) -> StepRecord:
        return cls(
            step=report.step,
            scale=report.scale,
            skipped=report.skipped,
            offenders=list(report.offenders),
            total_norm=report.total_norm,
            headroom=report.headroom,
            recommended_scale=report.recommended_scale,
            first_nonfinite=report.first_nonfinite,
            ranks_with_inf=report.ranks_with_inf,
            inf_origin=report.inf_origin,
            poisoned=report.poisoned,
            scale_decision=report.scale_decision,
        )

    @classmethod
    def from_log_record(cls, record: dict) -> StepRecord:
        """The record of a run-log line (amp_inspect.read_log), so logs get the same summary as live runs."""
        room = record.get("headroom") or {}
        skipped = bool(record.get("skipped", False))
        if "poisoned" in record:
            poisoned = bool(record["poisoned"])
        else:  # logs written before "poisoned" existed called a no-scaler NaN step "skipped"
            poisoned = skipped and record.get("scale") is None
            skipped = skipped and not poisoned
        return cls(
            step=int(record["step"]),
            scale=record.get("scale"),
            skipped=skipped,
            offenders=list(record.get("offenders", [])),
            total_norm=float(record.get("total_norm", float("nan"))),
            headroom=Headroom(room.get("up"), room.get("down")),
            recommended_scale=record.get("recommended_scale"),
            first_nonfinite=record.get("first_nonfinite"),
            ranks_with_inf=[int(r) for r in record["inf_by_rank"]] if "inf_by_rank" in record else None,
            inf_origin=record.get("inf_origin"),
            poisoned=poisoned,
            scale_decision=decision_from_record(record["scale_decision"]) if record.get("scale_decision") else None,
        )


@dataclass(frozen=True)
class ScaleEvent:
    step: int
    kind: str  # "growth" or "backoff"
    old: float
    new: float


@dataclass
class Summary:
    steps: int
    skipped: int
    skip_rate: float
    events: list[ScaleEvent]
    offenders: Counter  # module -> number of skipped steps it was an offender in
    advice: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ranks: Counter = field(default_factory=Counter)  # distributed: rank -> skipped steps its gradients held NaN in
    ranks_made_them: bool = False  # the counts came from before DDP's all-reduce: the ranks produced the NaN/Inf
    poisoned: int = 0  # steps with NaN/Inf gradients that no enabled GradScaler skipped: the optimizer applied them
    poisoned_offenders: Counter = field(default_factory=Counter)  # module -> poisoned steps it had NaN/Inf in
    policy: str = POLICY_TORCH  # the loss-scale policy of the run (scale_timeline.policy_of)
    decisions: list[ScaleChange] = field(default_factory=list)  # the policy's decisions that changed or skipped

    @property
    def ranks_heading(self) -> str:
        return ORIGIN_HEADINGS[BEFORE_ALLREDUCE if self.ranks_made_them else SHARDS]

    def __str__(self) -> str:
        lines = [f"{self.steps} inspected steps, {self.skipped} skipped ({self.skip_rate:.1%})"]
        if self.poisoned:
            lines[0] += f", {self.poisoned} poisoned (NaN/Inf applied by the optimizer: no enabled GradScaler)"
        growth = sum(e.kind == "growth" for e in self.events)
        backoff = len(self.events) - growth
        lines.append(f"loss scale: {growth} growth and {backoff} backoff events")
        if self.policy != POLICY_TORCH:
            counts = ", ".join(f"{n} {reason}" for reason, n in reason_counts(self.decisions).most_common())
            lines[-1] += f"; policy {self.policy!r}: {len(self.decisions)} decisions changed the scale or skipped"
            lines[-1] += f" ({counts})" if counts else ""
        if self.offenders:
            top = ", ".join(f"{shown_name(m)} ({n})" for m, n in self.offenders.most_common(5))
            lines.append(f"modules behind skipped steps: {top}")
        if self.ranks:
            lines.append(f"{self.ranks_heading}: " + ", ".join(f"{r} ({n})" for r, n in self.ranks.most_common(8)))
        lines += [f"WARNING: {w}" for w in self.warnings]
        lines += [f"advice: {a}" for a in self.advice]
        return "\n".join(lines)


def scale_events(history: list[StepRecord]) -> list[ScaleEvent]:
    events = []
    for prev, cur in zip(history, history[1:], strict=False):
        if prev.scale is None or cur.scale is None or prev.scale == cur.scale:
            continue
        events.append(ScaleEvent(cur.step, "growth" if cur.scale > prev.scale else "backoff", prev.scale, cur.scale))
    return events


def longest_skip_run(history: list[StepRecord]) -> tuple[int, int]:
    """(length, index of the last record) of the longest run of consecutive skipped steps (consecutive in
    step numbers: under every=N, skips several steps apart are not a run)."""
    best, best_end, run = 0, -1, 0
    for i, r in enumerate(history):
        adjacent = i > 0 and history[i - 1].step == r.step - 1
        run = (run + 1 if adjacent else 1) if r.skipped else 0
        if run > best:
            best, best_end = run, i
    return best, best_end


def collapse_warning(history: list[StepRecord], collapse_skips: int) -> str | None:
    """A message when the latest records show a collapse, naming the modules responsible; else None."""
    if not history:
        return None
    last = history[-1]
    if last.scale is not None and not (math.isfinite(last.scale) and last.scale > 0):
        # Not a collapse the scaler recovers from: its state is broken (every later step is judged wrongly).
        return (
            f"the loss scale at step {last.step} is {last.scale:g}, not a finite positive number: the scaler's "
            "state is broken (a bad state_dict or update(new_scale)?); reset it"
        )
    run = 0
    for i in range(len(history) - 1, -1, -1):
        if not history[i].skipped:
            break
        run += 1
        if i > 0 and history[i - 1].step != history[i].step - 1:
            break  # not consecutive steps (every=N): the run ends here
    if not ((last.scale is not None and last.scale < 1.0) or run >= collapse_skips):
        return None
    culprits = Counter(m for r in history[len(history) - max(run, 1) :] for m in r.offenders)
    named = ", ".join(shown_name(m) for m, _ in culprits.most_common(3)) or "no module (no NaN/Inf in gradients)"
    scale = "none" if last.scale is None else f"{last.scale:g}"
    if run == 0:
        return f"loss scale collapse at step {last.step}: scale {scale} is below 1"
    return f"loss scale collapse at step {last.step}: scale {scale}, {run} skipped steps in a row; offenders: {named}"


def summarize(
    history: list[StepRecord],
    *,
    init_scale: float | None = None,
    growth_interval: int | None = None,
    backoff_factor: float | None = None,
    collapse_skips: int = COLLAPSE_SKIPS,
) -> Summary:
    """Turns the history into rates, events, the loss-scale policy's decisions and advice: on GradScaler's
    init_scale, growth_interval and backoff_factor (pass the scaler's settings to get advice phrased against
    them), or, when the history carries ScaleDecisions (policy="headroom"), on what those decisions show."""
    skipped = [r for r in history if r.skipped]
    events = scale_events(history)
    offenders = Counter(m for r in skipped for m in r.offenders)
    summary = Summary(len(history), len(skipped), len(skipped) / len(history) if history else 0.0, events, offenders)
    summary.ranks = Counter(rank for r in skipped for rank in (r.ranks_with_inf or []))
    summary.ranks_made_them = all(r.inf_origin == BEFORE_ALLREDUCE for r in skipped if r.ranks_with_inf)
    if not history:
        return summary
    poisoned = [r for r in history if r.poisoned]
    summary.poisoned = len(poisoned)
    if poisoned:
        summary.poisoned_offenders = where = Counter(m for r in poisoned for m in r.offenders)
        named = ", ".join(shown_name(m) for m, _ in where.most_common(3)) or "no module named"
        summary.advice.append(
            f"{len(poisoned)} steps (first: step {poisoned[0].step}) had NaN/Inf gradients ({named}) and no enabled "
            "GradScaler to skip them: the optimizer applied them, so the weights may be NaN from there on. bf16 needs "
            "no loss scale, so find the source (the first_nonfinite finding, the data, the learning rate), and guard "
            "the step: skip it when report.found_inf, or clip with clip_grad_norm_(..., error_if_nonfinite=True)"
        )

    warning = collapse_warning(history, collapse_skips)
    run, _ = longest_skip_run(history)
    if warning is None and run >= collapse_skips:
        named = ", ".join(map(shown_name, offenders)) or "none"
        warning = f"{run} skipped steps in a row earlier in the run (offenders: {named})"
    if warning:
        summary.warnings.append(warning)

    # Every NaN/Inf made on one rank of several: its data shard or its device, not the model or the scale. (FSDP2
    # shards only say which rank owns the elements, not which rank made them: no advice from those.)
    traced = [r for r in skipped if r.ranks_with_inf]
    if summary.ranks_made_them and len(summary.ranks) == 1 and len(traced) >= 2 and len(traced) == len(skipped):
        rank = next(iter(summary.ranks))
        summary.advice.append(
            f"every skipped step's NaN/Inf came from rank {rank} alone: look at the data that rank reads, or its "
            "device (a faulty GPU shows up as one rank)"
        )

    summary.policy = policy_of(r.scale_decision for r in history)
    summary.decisions = scale_changes([r.step for r in history], [r.scale_decision for r in history])
    if summary.policy == POLICY_HEADROOM:
        summary.advice += _headroom_policy_advice(history, summary.decisions)
    else:
        summary.advice += _gradscaler_advice(history, events, run, growth_interval, backoff_factor)
    return summary


def _gradscaler_advice(
    history: list[StepRecord],
    events: list[ScaleEvent],
    run: int,
    growth_interval: int | None,
    backoff_factor: float | None,
) -> list[str]:
    """Advice on GradScaler's init_scale, growth_interval and backoff_factor (policy="torch": they set the scale);
    ``run`` is the longest run of skipped steps."""
    advice: list[str] = []
    skipped = [r for r in history if r.skipped]
    # Skips at the very start: init_scale is too high for this model.
    first_clean = next((i for i, r in enumerate(history) if not r.skipped), len(history))
    if first_clean >= 2 and history[0].scale is not None:
        settled = history[first_clean].scale if first_clean < len(history) else None
        hint = f" (the run settled at {settled:g})" if settled is not None else ""
        advice.append(
            f"the first {first_clean} steps were skipped while the scale backed off from {history[0].scale:g}"
            f"{hint}: lower init_scale to about the settled value"
        )

    # The scale keeps bouncing off the same ceiling: growth is too eager there.
    ceilings = Counter(e.old for e in events if e.kind == "backoff")
    if ceilings:
        ceiling, hits = ceilings.most_common(1)[0]
        if hits >= 3:
            interval = f" (now {growth_interval})" if growth_interval else ""
            advice.append(
                f"the scale backed off from {ceiling:g} {hits} times: it keeps growing into the same overflow; "
                f"raise growth_interval{interval} or start at init_scale {ceiling / 2:g}"
            )

    # Skips in bursts: each skip only halves, so a larger step down would recover in fewer skipped steps.
    if run >= 3:
        factor = f" (now {backoff_factor:g})" if backoff_factor else ""
        advice.append(
            f"skips came in runs of up to {run}: a smaller backoff_factor{factor}, e.g. 0.25, recovers in fewer steps"
        )

    # No skips and plenty of room above: the scale could be higher to keep small gradients out of underflow.
    ups = [r.headroom.up for r in history if r.headroom.up is not None]
    downs = [r.headroom.down for r in history if r.headroom.down is not None]
    if not skipped and ups and min(ups) >= 4 and downs and min(downs) < 4:
        advice.append(
            f"no skips and at least {min(ups)} doublings of headroom on every step, while small gradients sit "
            f"{min(downs)} halvings from underflow: a higher init_scale or a shorter growth_interval keeps more of them"
        )
    recommended = [r.recommended_scale for r in history[-10:] if r.recommended_scale]
    if recommended:
        median = sorted(recommended)[len(recommended) // 2]
        exponent = round(math.log2(median))
        advice.append(f"recent steps balance overflow and underflow margins at a scale of 2^{exponent}")
    return advice


def _headroom_policy_advice(history: list[StepRecord], decisions: list[ScaleChange]) -> list[str]:
    """Advice for a run under policy="headroom", where the measured exponents set the scale (GradScaler's
    init_scale, growth_interval and backoff_factor do not): what its decisions say about the run."""
    advice: list[str] = []
    margin = next(r.scale_decision.margin for r in reversed(history) if r.scale_decision is not None)
    innocent = [c for c in decisions if c.decision.reason == NONFINITE_NOT_FROM_SCALE]
    if innocent:
        where = Counter(m for c in innocent for m in c.decision.offenders)
        named = ", ".join(shown_name(m) for m, _ in where.most_common(3)) or "no module named"
        advice.append(
            f"{len(innocent)} skipped steps (first: step {innocent[0].step}) held NaN/Inf that the loss scale did not "
            f"cause ({named}): the headroom policy skipped them without collapsing the scale. No scaler setting "
            "fixes them: look for the source (the first_nonfinite finding, the data, the learning rate)"
        )
    widened = [c for c in decisions if c.decision.reason == MARGIN]
    if widened:
        advice.append(
            f"the policy widened its margin {len(widened)} time(s) (first at step {widened[0].step}), to {margin} "
            "binades under the format's ceiling: a gradient inside backward, larger than the parameter gradients "
            "it measures, overflowed. It keeps that margin for the run (state_dict); "
            f"HeadroomPolicy(margin={margin}) starts a new run with it"
        )
    overflows = [c for c in decisions if c.decision.skip == SKIP_OVERFLOW and c.decision.reason != MARGIN]
    if len(overflows) >= 3:
        advice.append(
            f"{len(overflows)} steps (first: step {overflows[0].step}) overflowed at the scale the policy chose: the "
            f"gradients grew by more than its margin of {margin} binades from one step to the next; a wider margin "
            f"(HeadroomPolicy(margin={margin + 1})) trades a little underflow for fewer skips"
        )
    downs = [r.headroom.down for r in history if r.headroom.down is not None]
    if downs and min(downs) < 0:
        advice.append(
            f"small gradients underflow to zero even at the scales the policy chose ({min(downs)} halvings of "
            f"headroom below) while it keeps {margin} binades under the ceiling: the gradients span more than the "
            "format's range; bf16 autocast (no loss scale needed) keeps them"
        )
    return advice
