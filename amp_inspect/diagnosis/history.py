"""The run so far: one StepRecord per inspected step, the loss-scale events they imply, and advice.

A **growth** event is a step whose loss scale is larger than at the previous inspected step, a **backoff**
one whose scale is smaller. The **skip rate** is skipped steps / inspected steps. A **collapse** is a loss
scale that fell by at least ``COLLAPSE_FACTOR`` over ``collapse_skips`` or more skipped steps in a row at the end
of the history, and stayed down (or, under GradScaler's own policy, a scale below 1, where it only gets by falling):
training has stopped making progress. Skipped steps in a row at a scale that did not fall that far are reported
as what they are (the scale did not cause them), not as a collapse; a policy's deliberate low scale is none.
The NaN/Inf **followed the scale** when a run of skipped steps ended with a clean step at a lower scale (a
smaller scale cured them); it did **not** when the scale fell by ``COLLAPSE_FACTOR`` and the steps stayed NaN.
A **poisoned** step had NaN/Inf gradients and no enabled GradScaler to skip it: unless the training loop skips it
itself (the tool cannot see that), the optimizer applied them.
It is counted apart from skipped steps (no loss-scale advice fits it).

The advice depends on the loss-scale policy the run used (scale_timeline.policy_of: the name its records'
ScaleDecisions carry, ``"torch"`` when they carry none): GradScaler's init_scale, growth_interval and
backoff_factor set its scale under ``policy="torch"``; under a ScalePolicy its decisions set it, and the advice is
the policy's own (``advice`` of its class in amp_inspect/scaling/policies.py's registry, read from ``RunFacts``).

Torch-free, so a run log is summarised without loading torch.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from types import EllipsisType
from typing import TYPE_CHECKING

from amp_inspect.core.advice import Advice
from amp_inspect.core.printable import shown_name
from amp_inspect.diagnosis.incident import WeightPoisoning, origin_steps, weight_poisoning
from amp_inspect.evidence.attribution import (
    BEFORE_ALLREDUCE,
    LOSS_OR_FORWARD,
    ORIGIN_HEADINGS,
    SHARDS,
    Blame,
    blame,
    every_module,
    finding_module,
)
from amp_inspect.evidence.headroom import Headroom
from amp_inspect.evidence.spikes import SPIKE_FACTOR, Spike, find_spikes
from amp_inspect.evidence.weights import WeightsSeen
from amp_inspect.scaling.policies import RunFacts, ScaleDecision, policy_advice
from amp_inspect.scaling.timeline import (
    POLICY_TORCH,
    ScaleChange,
    decision_from_record,
    policy_of,
    reason_counts,
    scale_changes,
)
from amp_inspect.updates.report import UpdateOverview, UpdateStats, UpdateVerdict, overview, update_verdicts

if TYPE_CHECKING:
    from amp_inspect.gradients.step_report import StepReport

COLLAPSE_SKIPS = 5  # skipped steps in a row that count as a loss-scale collapse (attach's default)
COLLAPSE_FACTOR = 2.0**4  # how far the scale must fall over them: GradScaler's fall over 5 skipped steps
RECENT_STEPS = 10  # the recommended scale is the median of this many recent steps' (one step follows one gradient)


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
    nonfinite_origin: str | None = (
        None  # the offender closest to the output in backward order (evidence/attribution.py)
    )
    fmt: str | None = None  # the format the gradients were judged against (the first of the inspector's formats)
    autocast: str | None = None  # the autocast dtype the step's forward ran under ("fp16", "bf16"), None unknown
    module_norms: dict[str, float | None] | None = None  # per-module gradient norms where known (evidence/spikes.py)
    everywhere: bool = False  # every module with gradients held NaN/Inf (attribution.every_module)
    update: UpdateStats | None = None  # update_every: what the step's optimizer.step() did (updates/report.py)
    weights: WeightsSeen | None = None  # after NaN/Inf gradients: whether the weights were NaN/Inf (evidence/weights)
    clip_norm: float | None = None  # the loop clips the gradient norm to this (the trainer's setting), None unknown

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
            nonfinite_origin=report.nonfinite_origin,
            fmt=report.formats[0] if report.formats else None,
            autocast=getattr(report, "autocast", None),
            everywhere=bool(report.offenders) and every_module(report.offenders, report.by_module),
            update=report.update,
            weights=report.weights.seen if report.weights is not None else None,
            clip_norm=report.clip_norm,
            # Every step: a spike's modules are judged against the same recent median with or without a log.
            module_norms=report.module_norms(),
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
            nonfinite_origin=record.get("nonfinite_origin"),
            fmt=str(record["formats"][0]) if record.get("formats") else None,
            autocast=record.get("autocast"),
            module_norms=_module_norms(record.get("modules")),
            everywhere=every_module(list(record.get("offenders", [])), record.get("modules")),
            update=UpdateStats.from_record(record["update"], int(record["step"])) if record.get("update") else None,
            weights=WeightsSeen.from_record(record["weights"]) if record.get("weights") else None,
            clip_norm=float(record["clip_norm"]) if record.get("clip_norm") is not None else None,
        )


def _module_norms(modules: object) -> dict[str, float | None] | None:
    """Module -> gradient norm from a log record's "modules" (None for an unknown norm), None without them."""
    if not isinstance(modules, dict) or not modules:
        return None
    out: dict[str, float | None] = {}
    for name, m in modules.items():
        value = m.get("grad_norm") if isinstance(m, dict) else None
        out[str(name)] = float(value) if isinstance(value, (int, float)) else None
    return out


def finding_kind(finding: str) -> str:
    """A first_nonfinite finding without its per-step details (counts, amax, step), so that the same finding on
    several steps is one line: "h.1.mlp.c_fc: output gradient went non-finite"."""
    text = re.sub(r", step \d+$", "", finding)
    text = re.sub(r" \(\d+ NaN/Inf\)", "", text)
    return re.sub(r", amax [^,]*", "", text)


def first_findings(history: list[StepRecord], poisoning: WeightPoisoning | None | EllipsisType = ...) -> Counter:
    """first_nonfinite findings (finding_kind) -> the steps that had them, most first; the hooks' note that they saw
    nothing is left out, and so are steps whose NaN/Inf followed from poisoned weights (incident.origin_steps;
    ``poisoning`` as there)."""
    steps = origin_steps(history, poisoning)
    return Counter(finding_kind(r.first_nonfinite) for r in steps if finding_module(r.first_nonfinite))


def nonfinite_blame(
    history: list[StepRecord], poisoned: bool = False, poisoning: WeightPoisoning | None | EllipsisType = ...
) -> Blame:
    """Where the NaN/Inf of the skipped (or the poisoned) steps started: attribution.blame on the history, leaving
    out the steps whose NaN/Inf followed from poisoned weights (incident.origin_steps; ``poisoning`` as there)."""
    steps = [r for r in origin_steps(history, poisoning) if (r.poisoned if poisoned else r.skipped)]
    return blame((r.offenders, r.first_nonfinite, r.nonfinite_origin, r.everywhere) for r in steps)


def top_offender(history: list[StepRecord]) -> str | None:
    """The module the skipped (else the poisoned) steps' NaN/Inf started in most often: what every surface calls
    "the top offender"."""
    poisoning = weight_poisoning(history)
    return nonfinite_blame(history, poisoning=poisoning).top or nonfinite_blame(history, True, poisoning).top


def where_started(
    history: list[StepRecord],
    start: int,
    end: int,
    default: str,
    poisoning: WeightPoisoning | None | EllipsisType = ...,
) -> str:
    """Where the NaN/Inf of ``history[start:end + 1]`` started, as a run of steps is told: the weights when they
    were already NaN/Inf on those steps (incident.weight_poisoning of the whole history: ``poisoning`` when the
    caller has it), else the top of their blame, else ``default``."""
    if poisoning is ...:
        poisoning = weight_poisoning(history)
    if poisoning is not None and history[start].step in poisoning.consequences:
        return f"the weights, NaN/Inf since step {poisoning.since} (every gradient follows from them)"
    return nonfinite_blame(history[start : end + 1], poisoning=poisoning).shown_top(default)


def uses_fp16(history: list[StepRecord]) -> bool:
    """Whether fp16's range is the run's concern: the gradients were judged against fp16, and either the forward
    ran fp16 autocast (or its dtype was not seen) or a loss scaler acted (its scale is set against fp16's range,
    whatever autocast ran). A bf16 run without a scaler is not an fp16 run, whatever it was judged against."""
    fmt = next((r.fmt for r in reversed(history) if r.fmt), "fp16")
    seen = next((r.autocast for r in reversed(history) if r.autocast), None)
    return fmt == "fp16" and (seen in (None, "fp16", "off") or has_scaler(history))


def has_scaler(history: list[StepRecord]) -> bool:
    """Whether an enabled loss scaler acted in the run (a loss scale was recorded)."""
    return any(r.scale is not None for r in history)


def stable_recommended_scale(history: list[StepRecord], recent: int = RECENT_STEPS) -> tuple[float, int] | None:
    """(median, n): the median of the recommended scales of the last ``recent`` clean steps that have one, and n.
    One step's recommendation follows its single smallest nonzero gradient and jumps by several binades from step
    to step; the median does not."""
    values = [r.recommended_scale for r in history if not r.skipped and not r.poisoned and r.recommended_scale]
    values = values[-recent:]
    if not values:
        return None
    return sorted(values)[len(values) // 2], len(values)


def spikes_of(history: list[StepRecord]) -> list[Spike]:
    """The gradient spikes of the history (evidence/spikes.py)."""
    return find_spikes([r.step for r in history], [r.total_norm for r in history], [r.module_norms for r in history])


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
    offenders: Counter  # module -> skipped steps with NaN/Inf in this module's gradients (not: steps it caused)
    advice: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ranks: Counter = field(default_factory=Counter)  # distributed: rank -> skipped steps its gradients held NaN in
    ranks_made_them: bool = False  # the counts came from before DDP's all-reduce: the ranks produced the NaN/Inf
    poisoned: int = 0  # steps with NaN/Inf gradients that no enabled GradScaler skipped: the optimizer applied them
    poisoned_offenders: Counter = field(default_factory=Counter)  # module -> poisoned steps it had NaN/Inf in
    policy: str = POLICY_TORCH  # the loss-scale policy of the run (scale_timeline.policy_of)
    decisions: list[ScaleChange] = field(default_factory=list)  # the policy's decisions that changed or skipped
    blame: Blame = field(default_factory=Blame)  # where the skipped steps' NaN/Inf started (attribution.blame)
    poisoned_blame: Blame = field(default_factory=Blame)  # the same for the poisoned steps
    first_nonfinite: Counter = field(default_factory=Counter)  # activation findings (finding_kind) -> steps
    spikes: list[Spike] = field(default_factory=list)
    autocast: str | None = None  # the autocast dtype the run's forward was seen under
    scaler: bool = False  # whether an enabled loss scaler acted
    # The advice lines in `advice` that are not about a loss scaler (the doctor files them apart): the poisoned
    # steps', the gradient spikes', and the one-rank NaN/Inf line; "" when the run has none.
    poisoned_advice: str = ""
    spike_advice: str = ""
    rank_advice: str = ""
    updates: list[UpdateVerdict] = field(default_factory=list)  # update_every: the verdicts on the updates
    # The weights became NaN/Inf (diagnosis/incident.py): the story every surface tells first; its steps'
    # NaN/Inf are left out of the blame above.
    weights: WeightPoisoning | None = None
    weights_advice: str = ""  # its action, first in `advice` (its headline is first in `warnings`)
    update_overview: UpdateOverview | None = None  # update_every: the measured optimizer steps merged by module

    @property
    def ranks_heading(self) -> str:
        return ORIGIN_HEADINGS[BEFORE_ALLREDUCE if self.ranks_made_them else SHARDS]

    @property
    def top_offender(self) -> str | None:
        """The module the NaN/Inf started in most often (skipped steps first, else poisoned ones)."""
        return self.blame.top or self.poisoned_blame.top

    def __str__(self) -> str:
        lines = [f"{self.steps} inspected steps, {self.skipped} skipped ({self.skip_rate:.1%})"]
        if self.poisoned:
            lines[0] += f", {self.poisoned} poisoned (NaN/Inf applied by the optimizer: no enabled GradScaler)"
        facts = [f"autocast {shown_name(self.autocast)}" if self.autocast else "autocast dtype not seen"]
        facts.append(f"loss scaler: policy '{shown_name(self.policy)}'" if self.scaler else "loss scaler: none")
        lines[0] += f" ({', '.join(facts)})"
        # The weights' story leads: every later NaN/Inf follows from it.
        first = self.weights.headline() if self.weights is not None else None
        if first is not None:
            lines.append(f"WARNING: {first}")
        # The activation hooks' findings lead: they name the module whose output went non-finite first.
        for finding, n in self.first_nonfinite.most_common(3):
            lines.append(
                f"first non-finite producer (activation hooks): {shown_name(finding, limit=None)} (on {n} steps)"
            )
        if len(self.first_nonfinite) > 3:
            lines.append(f"... and {len(self.first_nonfinite) - 3} more first non-finite findings")
        if self.scaler:
            growth = sum(e.kind == "growth" for e in self.events)
            backoff = len(self.events) - growth
            lines.append(f"loss scale: {growth} growth and {backoff} backoff events")
            if self.policy != POLICY_TORCH:
                reasons = reason_counts(self.decisions).most_common()
                counts = ", ".join(f"{n} {shown_name(reason)}" for reason, n in reasons)
                policy = shown_name(self.policy)
                lines[-1] += f"; policy '{policy}': {len(self.decisions)} decisions changed the scale or skipped"
                lines[-1] += f" ({counts})" if counts else ""
        if self.blame.origins:
            lines.append(self.blame.describe("skipped steps"))
        elif self.poisoned_blame.origins:
            lines.append(self.poisoned_blame.describe("poisoned steps"))
        if self.offenders:
            top = ", ".join(f"{shown_name(m)} ({n})" for m, n in self.offenders.most_common(5))
            lines.append(f"skipped steps with NaN/Inf in these modules' gradients: {top}")
        if self.ranks:
            lines.append(f"{self.ranks_heading}: " + ", ".join(f"{r} ({n})" for r, n in self.ranks.most_common(8)))
        if self.update_overview is not None:
            lines.append(self.update_overview.headline())
        lines += [f"WARNING: {w}" for w in self.warnings if w != first]
        lines += [str(spike) for spike in self.spikes[:5]]
        if len(self.spikes) > 5:
            lines.append(f"... and {len(self.spikes) - 5} more gradient spikes")
        lines += [f"advice: {a}" for a in self.advice]
        # Each line a line: a string of the log that escaped the escaping above cannot start another (or retitle
        # the terminal).
        return "\n".join(shown_name(line, limit=None) for line in lines)


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


@dataclass(frozen=True)
class SkipRun:
    """Consecutive skipped steps: ``history[start:end + 1]``; ``after`` is the index of the clean step that ended
    the run (None when the history ends in it)."""

    start: int
    end: int
    after: int | None

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def skip_runs(history: list[StepRecord]) -> list[SkipRun]:
    """Every run of consecutive skipped steps (consecutive in step numbers), in order."""
    runs: list[SkipRun] = []
    start = None
    for i, r in enumerate(history):
        adjacent = i > 0 and history[i - 1].step == r.step - 1
        if r.skipped:
            if start is None or not adjacent:
                if start is not None:
                    runs.append(SkipRun(start, i - 1, None))
                start = i
            continue
        if start is not None:
            runs.append(SkipRun(start, i - 1, i if adjacent else None))
            start = None
    if start is not None:
        runs.append(SkipRun(start, len(history) - 1, None))
    return runs


def scale_fall(history: list[StepRecord], run: SkipRun) -> float:
    """How many times smaller the scale is after the run (the clean step, else the run's last step) than at its
    start; 1 when unknown."""
    first = history[run.start].scale
    last = history[run.after if run.after is not None else run.end].scale
    if not first or not last or not (math.isfinite(first) and math.isfinite(last)) or last <= 0:
        return 1.0
    return first / last


def followed_the_scale(history: list[StepRecord], run: SkipRun) -> bool:
    """The run ended with a clean step at a lower scale: a smaller scale cured the NaN/Inf."""
    return run.after is not None and scale_fall(history, run) > 1


def collapse_warning(
    history: list[StepRecord], collapse_skips: int, poisoning: WeightPoisoning | None | EllipsisType = ...
) -> str | None:
    """A message when the latest records show a collapse (the module docstring defines it), or skipped steps in a
    row at a scale that did not fall (said as such), naming where the NaN/Inf started (``poisoning``: as in
    where_started); else None."""
    if not history:
        return None
    last = history[-1]
    if last.scale is not None and not (math.isfinite(last.scale) and last.scale > 0):
        # Not a collapse the scaler recovers from: its state is broken (every later step is judged wrongly).
        return (
            f"the loss scale at step {last.step} is {last.scale:g}, not a finite positive number: the scaler's "
            "state is broken (a bad state_dict or update(new_scale)?); reset it"
        )
    runs = skip_runs(history)
    trailing = runs[-1] if runs and runs[-1].after is None and runs[-1].end == len(history) - 1 else None
    policy = policy_of(r.scale_decision for r in history)
    scale = "none" if last.scale is None else f"{last.scale:g}"
    if trailing is None or trailing.length < collapse_skips:
        if policy == POLICY_TORCH and last.scale is not None and last.scale < 1.0:
            # GradScaler starts far above 1: below it, it backed off that far and has not grown back. (A policy
            # that chooses a scale below 1 from the measured gradients has not collapsed.)
            return f"loss scale collapse at step {last.step}: scale {scale} is below 1"
        return None
    where = where_started(history, trailing.start, trailing.end, "no module (no NaN/Inf in gradients)", poisoning)
    fall = scale_fall(history, trailing)
    first = history[trailing.start].scale
    if last.scale is not None and fall >= COLLAPSE_FACTOR:
        return (
            f"loss scale collapse at step {last.step}: the scale fell from {first:g} to {scale} ({fall:g}x, at "
            f"least {COLLAPSE_FACTOR:g}x) over {trailing.length} skipped steps in a row and stayed down; the NaN/Inf "
            f"started in {where}"
        )
    held = f"at loss scale {scale}" if fall == 1 else f"while the scale fell only from {first:g} to {scale}"
    return (
        f"{trailing.length} skipped steps in a row up to step {last.step} {held}: not a loss-scale collapse (the "
        f"scale did not fall {COLLAPSE_FACTOR:g}x); the NaN/Inf started in {where}"
    )


def summarize(
    history: list[StepRecord],
    *,
    init_scale: float | None = None,
    growth_interval: int | None = None,
    backoff_factor: float | None = None,
    collapse_skips: int = COLLAPSE_SKIPS,
) -> Summary:
    """Turns the history into rates, events, the loss-scale policy's decisions, where the NaN/Inf started, spikes
    and advice that fits the run: loss-scale advice only where a scaler acted, on GradScaler's init_scale,
    growth_interval and backoff_factor (pass the scaler's settings to get advice phrased against them) or, when
    the history carries ScaleDecisions (policy="headroom"), on what those decisions show; fp16 margins only where
    fp16 is the format."""
    skipped = [r for r in history if r.skipped]
    events = scale_events(history)
    offenders = Counter(m for r in skipped for m in r.offenders)
    summary = Summary(len(history), len(skipped), len(skipped) / len(history) if history else 0.0, events, offenders)
    summary.ranks = Counter(rank for r in skipped for rank in (r.ranks_with_inf or []))
    summary.ranks_made_them = all(r.inf_origin == BEFORE_ALLREDUCE for r in skipped if r.ranks_with_inf)
    if not history:
        return summary
    summary.weights = weight_poisoning(history)
    summary.blame = nonfinite_blame(history, poisoning=summary.weights)
    summary.poisoned_blame = nonfinite_blame(history, True, summary.weights)
    summary.first_nonfinite = first_findings(history, summary.weights)
    summary.spikes = spikes_of(history)
    summary.autocast = next((r.autocast for r in reversed(history) if r.autocast), None)
    summary.scaler = has_scaler(history)
    summary.policy = policy_of(r.scale_decision for r in history)
    if summary.weights is not None:
        summary.warnings.append(summary.weights.headline())
        summary.weights_advice = Advice(
            summary.weights.action(), code="weights-poisoned", severity="error", steps=(summary.weights.since,)
        )
        summary.advice.append(summary.weights_advice)
    summary.poisoned = sum(r.poisoned for r in history)
    # The poisoned steps an origin is traced on: not those whose NaN/Inf came from weights already NaN/Inf, and not
    # the one step that made them so (the weights finding tells that one).
    made_them = summary.weights.by_step if summary.weights is not None else None
    poisoned = [r for r in origin_steps(history, summary.weights) if r.poisoned and r.step != made_them]
    if poisoned:
        summary.poisoned_offenders = Counter(m for r in poisoned for m in r.offenders)
        named = summary.poisoned_blame.shown_top("no module named")
        # Said by the autocast dtype seen: a run whose forward was not seen under autocast (fp32) is told neither.
        first_words = {
            "bf16": "bf16 needs no loss scale, so find",
            "fp16": "fp16 autocast needs a GradScaler (the doctor says how); and find",
        }.get(summary.autocast or "", "Find")
        # The tool sees no GradScaler skip them, but the user's loop may skip such steps itself: it cannot tell.
        summary.poisoned_advice = Advice(
            f"{len(poisoned)} steps (first: step {poisoned[0].step}) had NaN/Inf gradients (started in {named}) and "
            "no enabled GradScaler to skip them",
            "unless your loop skips them, the optimizer applied them, so the "
            f"weights may be NaN from there on. {first_words} the source "
            f"({_source_hint(summary)}), and guard the step: skip it when report.found_inf, or clip with "
            "clip_grad_norm_(..., error_if_nonfinite=True)",
            code="poisoned-steps",
            severity="warning",
            steps=[r.step for r in poisoned],
            modules=[m for m in (summary.poisoned_blame.top,) if m and m != LOSS_OR_FORWARD],
        )
        summary.advice.append(summary.poisoned_advice)

    warning = collapse_warning(history, collapse_skips, summary.weights)
    run, end = longest_skip_run(history)
    if warning is None and run >= collapse_skips:
        where = where_started(history, end - run + 1, end, "no module named", summary.weights)
        warning = f"{run} skipped steps in a row earlier in the run, up to step {history[end].step}"
        warning += f" (started in {where})"
    if warning:
        summary.warnings.append(warning)
    if summary.spikes and not summary.scaler:
        first = summary.spikes[0]
        clips = next((r.clip_norm for r in reversed(history) if r.clip_norm), None)
        # A loop that clips already took a clipped step: telling it to clip would be advice it has followed.
        took = (
            f"the loop clips the gradient norm to {clips:g}, so the optimizer took a clipped step; look at those "
            "batches and the learning rate"
            if clips
            else "the optimizer takes the whole step; look at those batches and the learning rate, or clip the "
            "gradient norm"
        )
        summary.spike_advice = Advice(
            f"{len(summary.spikes)} gradient spike{'s' if len(summary.spikes) > 1 else ''} over {SPIKE_FACTOR:g}x "
            f"the recent median (first: step {first.step})",
            f"with no loss scaler nothing skips them and {took}",
            code="gradient-spikes",
            steps=[s.step for s in summary.spikes],
            modules=dict.fromkeys(m for s in summary.spikes for m, _ in s.rose),
        )
        summary.advice.append(summary.spike_advice)

    # Every NaN/Inf made on one rank of several: its data shard or its device, not the model or the scale. (FSDP2
    # shards only say which rank owns the elements, not which rank made them: no advice from those.)
    traced = [r for r in skipped if r.ranks_with_inf]
    if summary.ranks_made_them and len(summary.ranks) == 1 and len(traced) >= 2 and len(traced) == len(skipped):
        rank = next(iter(summary.ranks))
        summary.rank_advice = Advice(
            f"every skipped step's NaN/Inf came from rank {rank} alone",
            "look at the data that rank reads, or its device (a faulty GPU shows up as one rank)",
            code="one-rank-nonfinite",
            steps=[r.step for r in traced],
        )
        summary.advice.append(summary.rank_advice)

    summary.update_overview = overview([r.update for r in history if r.update is not None])
    summary.updates = update_verdicts(summary.update_overview)
    summary.advice += [v.advice for v in summary.updates]

    summary.decisions = scale_changes([r.step for r in history], [r.scale_decision for r in history])
    if not summary.scaler:
        return summary  # no loss scale acted: no loss-scale advice fits
    if summary.policy != POLICY_TORCH:
        summary.advice += policy_advice(summary.policy, _run_facts(history, summary))
    else:
        summary.advice += _gradscaler_advice(history, summary, growth_interval, backoff_factor)
    return summary


def _source_hint(summary: Summary) -> str:
    """Where to look for the source of NaN/Inf, from what the run already holds."""
    if summary.first_nonfinite:
        return f"the activation hooks name it: {shown_name(summary.first_nonfinite.most_common(1)[0][0], limit=None)}"
    top = summary.top_offender
    if top == LOSS_OR_FORWARD:
        where = "every module's gradients held it, so it came from the forward pass or the loss; "
    else:
        where = f"it started in {shown_name(top)}, by backward order; " if top else ""
    return f"{where}attach(..., activations='on_skip') names the first module whose output went non-finite"


def _gradscaler_advice(
    history: list[StepRecord],
    summary: Summary,
    growth_interval: int | None,
    backoff_factor: float | None,
) -> list[str]:
    """Advice on GradScaler's init_scale, growth_interval and backoff_factor (policy="torch": they set the scale),
    each only where the run's own facts call for it."""
    advice: list[str] = []
    events = summary.events
    runs = skip_runs(history)
    cured = [run for run in runs if followed_the_scale(history, run)]
    # Skips at the very start that a lower scale cured: init_scale is too high for this model.
    if runs and runs[0].start == 0 and runs[0] in cured and runs[0].length >= 2 and history[0].scale is not None:
        settled = history[runs[0].after].scale
        advice.append(
            Advice(
                f"the first {runs[0].length} steps were skipped while the scale backed off from "
                f"{history[0].scale:g} (the run settled at {settled:g})",
                "lower init_scale to about the settled value",
                steps=[r.step for r in history[runs[0].start : runs[0].end + 1]],
            )
        )

    # The scale keeps bouncing off the same ceiling: growth is too eager there.
    ceilings = Counter(e.old for e in events if e.kind == "backoff")
    if ceilings:
        ceiling, hits = ceilings.most_common(1)[0]
        if hits >= 3:
            interval = f" (now {growth_interval})" if growth_interval else ""
            advice.append(
                # Not "a lower init_scale": GradScaler grows back every growth_interval clean steps from wherever
                # it started, so only a longer interval makes the bounces rarer.
                Advice(
                    f"the scale backed off from {ceiling:g} {hits} times",
                    f"it keeps growing into the same overflow; raise growth_interval{interval} (each bounce skips a "
                    "step; a lower init_scale would not help, the scale grows back to the same ceiling)",
                    steps=[e.step for e in events if e.kind == "backoff" and e.old == ceiling],
                )
            )

    # Skips in bursts that a lower scale ended: each skip only halves, so a larger step down recovers sooner.
    longest_cured = max((run.length for run in cured), default=0)
    if longest_cured >= 3:
        factor = f" (now {backoff_factor:g})" if backoff_factor else ""
        advice.append(
            Advice(
                f"skips came in runs of up to {longest_cured} that ended at a lower scale",
                f"a smaller backoff_factor{factor}, e.g. 0.25, recovers in fewer steps",
            )
        )
    # NaN/Inf that the scale did not cause: it fell far and the steps stayed non-finite.
    stuck = [run for run in runs if run.after is None and scale_fall(history, run) >= COLLAPSE_FACTOR]
    if stuck:
        run = stuck[-1]
        advice.append(
            Advice(
                f"the NaN/Inf did not follow the loss scale (it fell from {history[run.start].scale:g} to "
                f"{history[run.end].scale:g} and every step stayed non-finite, so no scaler setting fixes them)",
                f"find the source ({_source_hint(summary)})",
                severity="warning",
                steps=[r.step for r in history[run.start : run.end + 1]],
            )
        )

    if not uses_fp16(history):
        return advice  # the margins below are fp16's: a bf16 run has float32's range
    # No skips and plenty of room above: the scale could be higher to keep small gradients out of underflow.
    ups = [r.headroom.up for r in history if r.headroom.up is not None]
    downs = [r.headroom.down for r in history if r.headroom.down is not None]
    if not summary.skipped and ups and min(ups) >= 4 and downs and min(downs) < 4:
        advice.append(
            Advice(
                f"no skips and at least {min(ups)} doublings of headroom on every step, while small gradients sit "
                f"{min(downs)} halvings from underflow",
                "a higher init_scale or a shorter growth_interval keeps more of them",
            )
        )
    stable = stable_recommended_scale(history)
    if stable is not None:
        median, n = stable
        advice.append(
            Advice(
                f"recent steps balance overflow and underflow margins at a scale of 2^{round(math.log2(median))} "
                f"(the median of the last {n} clean steps' recommendations)"
            )
        )
    return advice


def _run_facts(history: list[StepRecord], summary: Summary) -> RunFacts:
    """What a loss-scale policy's advice reads of the run (scale_policy.RunFacts)."""
    index = {r.step: i for i, r in enumerate(history)}
    downs = [r.headroom.down for r in history if r.headroom.down is not None]
    return RunFacts(
        decisions=[(c.step, c.decision) for c in summary.decisions],
        last=next(r.scale_decision for r in reversed(history) if r.scale_decision is not None),
        blame=summary.blame.shown_top("no module named"),
        source_hint=_source_hint(summary),
        clean_after=frozenset(step for step, i in index.items() if i + 1 < len(history) and not history[i + 1].skipped),
        min_down=min(downs) if downs else None,
        fp16=uses_fp16(history),
    )
