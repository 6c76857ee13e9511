"""The incident timeline: steps judged as a story, not one at a time. Once the weights are NaN/Inf, every later
forward pass and gradient is too, and a per-step verdict would name a new origin on each of those steps (the
embedding, the loss) and bury the one that mattered. Here the weight watch's reads (evidence/weights.py) decide:

- the first read that found non-finite weights, going into step M;
- the last point known to be finite before it: a read that found them finite, or a step whose gradients were all
  finite (a NaN/Inf weight used in the forward pass makes NaN/Inf gradients);
- between the two, the optimizer steps that ran (a skipped step changes no weight). When exactly one ran and every
  step between was inspected, that step made them: it applied NaN/Inf gradients that nothing skipped
  (``APPLIED_NONFINITE``; the origin is where that step's NaN/Inf started), or its gradients were finite and the
  optimizer step itself overflowed (``OPTIMIZER_STEP``: a half-precision optimizer state or update). Otherwise the
  cause is ``UNKNOWN`` and the timeline says what it knows;
- every inspected step from then on whose gradients held NaN/Inf, up to a read that finds the weights finite again
  (a restored checkpoint), is a **consequence**: left out of every ranking of origins (evidence/attribution.py's
  blame), and told as such.

Torch-free: a run log gets the same story as a live run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import EllipsisType
from typing import Protocol

from amp_inspect.core.printable import plural, shown_name
from amp_inspect.evidence.attribution import FROM_ACTIVATIONS, LOSS_OR_FORWARD, finding_overflowed, step_origin
from amp_inspect.evidence.weights import WeightsSeen

APPLIED_NONFINITE = "applied_nonfinite_gradients"
OPTIMIZER_STEP = "optimizer_step"
UNKNOWN = "unknown"
CAUSES = (APPLIED_NONFINITE, OPTIMIZER_STEP, UNKNOWN)


class Step(Protocol):
    """What the timeline reads of a step (diagnosis/history.py's StepRecord)."""

    step: int
    skipped: bool
    poisoned: bool
    offenders: list[str]
    first_nonfinite: str | None
    nonfinite_origin: str | None
    everywhere: bool
    weights: WeightsSeen | None


@dataclass(frozen=True)
class WeightPoisoning:
    """The weights became NaN/Inf: since which step, by which step's optimizer step and why, where that step's
    NaN/Inf started, which modules' weights were found so first, and which inspected steps follow from it."""

    since: int  # the first step whose forward pass used NaN/Inf weights (exact, or the first read: see ``exact``)
    exact: bool  # the step that made them is known (``by_step``)
    cause: str  # one of CAUSES
    by_step: int | None  # the step whose optimizer step made them
    origin: str | None  # APPLIED_NONFINITE: where that step's NaN/Inf started (a module, or the forward pass/loss)
    evidence: str | None  # how that origin was traced (attribution's FROM_* wording)
    overflowed: str | None  # the dtype the origin's forward output overflowed to Inf ("fp16"), if that is what it did
    first_read: WeightsSeen  # the first read that found them: which modules' weights
    finite_until: int | None  # the last step known to have run on finite weights
    consequences: tuple[int, ...]  # inspected steps whose NaN/Inf follow from the weights

    def headline(self) -> str:
        """One sentence: what happened, when, and what followed."""
        if self.cause == APPLIED_NONFINITE:
            why = (
                f"the optimizer applied step {self.by_step}'s NaN/Inf gradients (nothing skipped them), which started "
                f"in {shown_name(self.origin or '?')} ({self.evidence})"
            )
        elif self.cause == OPTIMIZER_STEP:
            why = (
                f"step {self.by_step}'s gradients were finite, so its optimizer step itself made them (a "
                "half-precision optimizer state or update overflowed)"
            )
        else:
            known = f"finite going into step {self.finite_until}, " if self.finite_until is not None else ""
            why = f"{known}which step made them is not known (not every step between was inspected)"
        when = f"at step {self.since}" if self.exact else f"by step {self.since}"
        followed = (
            f"; every inspected step since ({plural(len(self.consequences), 'step')} with NaN/Inf) follows from the "
            "weights: no new origin"
            if self.consequences
            else ""
        )
        return (
            f"the weights became NaN/Inf {when}: {why}; first found in {self.first_read.modules()}"
            f"{self._partial()}{followed}"
        )

    def action(self) -> str:
        """What to do, for this cause."""
        restore = f"the weights do not recover: restore a checkpoint saved before step {self.since}"
        guard = (
            "guard the optimizer step: skip it when report.found_inf, or clip with clip_grad_norm_(..., "
            f"error_if_nonfinite=True); {restore}"
        )
        if self.cause == APPLIED_NONFINITE and self.overflowed is not None:
            return (
                f"{shown_name(self.origin or '?')}'s forward output overflowed {self.overflowed} at step "
                f"{self.by_step} (its inputs were finite): run it in float32 (torch.autocast(..., enabled=False) "
                "around it, its inputs cast to float32) or keep its inputs smaller (a normalization before it, a "
                f"smaller init or learning rate); {guard}"
            )
        if self.cause == APPLIED_NONFINITE:
            # Traced by the gradients alone, the origin is where the gradients first held NaN/Inf; by the hooks (or
            # to the forward pass / the loss), what went non-finite.
            origin = shown_name(self.origin or "?")
            by_gradients = self.evidence != FROM_ACTIVATIONS and self.origin != LOSS_OR_FORWARD
            what = f"{origin}'s gradients held NaN/Inf" if by_gradients else f"{origin} went non-finite"
            return (
                f"find why {what} at step {self.by_step} (attach(..., "
                f"activations='always') names the first module whose output did), and {guard}"
            )
        if self.cause == OPTIMIZER_STEP:
            return (
                "keep the parameters and the optimizer state in float32 under autocast (a half-precision optimizer "
                "step overflows), or raise the optimizer's eps; attach(..., optimizer=opt, update_every=1) names the "
                f"modules each step made NaN/Inf; {restore}"
            )
        return (
            "inspect every step (every=1) to place the step that made them; guard the optimizer step: skip it when "
            f"report.found_inf; {restore}"
        )

    def to_json(self) -> dict[str, object]:
        """The typed facts, for the findings document (JSON values)."""
        return {
            "since": self.since,
            "exact": self.exact,
            "cause": self.cause,
            "by_step": self.by_step,
            "origin": self.origin,
            "origin_evidence": self.evidence,
            "origin_overflowed": self.overflowed,
            "finite_until": self.finite_until,
            "first_read": self.first_read.to_record(),
            "consequences": list(self.consequences),
        }

    def _partial(self) -> str:
        partial = self.first_read.partial
        return f" (this rank's shards only: {shown_name(partial, limit=None)})" if partial else ""


def weight_poisoning(history: Sequence[Step]) -> WeightPoisoning | None:
    """The poisoning of the weights in ``history`` (see the module docstring), None when no read found them
    NaN/Inf."""
    reads = [r.weights for r in history if r.weights is not None]
    bad = next((i for i, w in enumerate(reads) if not w.finite), None)
    if bad is None:
        return None
    first = reads[bad]
    into = first.into_step
    finite_reads = [w.into_step for w in reads[:bad] if w.finite and w.into_step < into]
    clean_steps = [r.step for r in history if r.step < into and not r.offenders]
    finite_until = max(finite_reads + clean_steps, default=None)
    by_step = {r.step: r for r in history}
    made_by: Step | None = None
    if finite_until is not None:
        between = [by_step.get(s) for s in range(finite_until, into)]
        ran = [r for r in between if r is not None and not r.skipped]
        if all(r is not None for r in between) and len(ran) == 1:
            made_by = ran[0]
    since = into if made_by is None else made_by.step + 1
    recovered = min((w.into_step for w in reads[bad + 1 :] if w.finite and w.into_step > into), default=None)
    consequences = tuple(
        r.step for r in history if r.step >= since and (recovered is None or r.step < recovered) and r.offenders
    )
    origin = evidence = overflowed = None
    if made_by is None:
        cause = UNKNOWN
    elif made_by.offenders:
        cause = APPLIED_NONFINITE
        where = step_origin(made_by.offenders, made_by.first_nonfinite, made_by.nonfinite_origin, made_by.everywhere)
        origin, evidence = where if where is not None else (None, None)
        overflowed = finding_overflowed(made_by.first_nonfinite)
    else:
        cause = OPTIMIZER_STEP
    return WeightPoisoning(
        since=since,
        exact=made_by is not None,
        cause=cause,
        by_step=None if made_by is None else made_by.step,
        origin=origin,
        evidence=evidence,
        overflowed=overflowed,
        first_read=first,
        finite_until=finite_until,
        consequences=consequences,
    )


def origin_steps(history: Sequence[Step], poisoning: WeightPoisoning | None | EllipsisType = ...) -> list[Step]:
    """``history`` without the steps whose NaN/Inf follow from poisoned weights: the steps an origin may be traced
    on. ``poisoning``: the run's weight_poisoning when the caller has it (once per summary; also what a part of
    the run is judged by), else read here from ``history``."""
    if poisoning is ...:
        poisoning = weight_poisoning(history)
    if poisoning is None:
        return list(history)
    followed = set(poisoning.consequences)
    return [r for r in history if r.step not in followed]
