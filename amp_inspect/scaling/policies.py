"""Loss-scale policies: the ``ScalePolicy`` protocol InspectingGradScaler drives, the registry that names each
policy's words for the run log's readers, and the headroom policy (``HeadroomPolicy``).

A policy is any object with a ``name`` (recorded with each decision in the run log) and four methods:
``first_scale(init_scale)``, ``decide(stats, growth_factor, backoff_factor, growth_interval)`` (a
``StepStats`` in, a ``ScaleDecision`` out), ``state_dict()`` and ``load_state_dict(state)``. The words a summary
or report uses for its decisions are class attributes read without an instance (a log is read without torch and
without the policy's options): ``reason_words`` and ``skip_words`` (reason / skip kind -> words), ``routine``
(reasons shown last on the timeline) and, optionally, ``advice(facts)`` (what its decisions say about a run).
``register_policy(cls)`` files them under ``cls.name`` (a class with the four methods, under a name not taken); a
new policy is one module that defines its class and registers it (tests/test_scale_policy.py has one in a dozen
lines). InspectingGradScaler checks what a policy returns: a ``ScaleDecision`` whose scale float32 holds.

The headroom policy: the next loss scale from the measured exponents of this step's gradients.

GradScaler is blind: it doubles the scale every ``growth_interval`` clean steps until something overflows,
then halves it. InspectingGradScaler measures, in its unscale pass, the largest finite scaled |grad|
(``amax``) and the NaN/Inf counts; this policy turns those into the next scale:

- **start**: the first step runs at ``probe_scale`` (1.0: fp16 gradients overflow there only if they overflow
  unscaled, which no loss scale >= 1 avoids), and the scale is then set from what that step measured;
- **headroom** (clean step): the scale becomes the power of two that leaves ``margin`` binades between the
  largest scaled gradient and the format's ceiling (fp16: 65520 rounds to Inf). It moves by as many binades
  as the measurement says, both ways: growth into measured room only, and a shrink before an overflow;
- **margin** (overflow while the finite gradients had >= margin binades of room): something the scaler does
  not see overflowed (an intermediate gradient in backward larger than the parameter gradients). The margin
  widens to one binade more than the room that was measured, for the rest of the run (kept in state_dict);
- **overflow** (Inf while the finite gradients sit within ``margin`` of the ceiling, or nothing measured):
  the scale caused it: back off by ``backoff_factor`` or to ``margin`` below the measured amax, whichever
  is lower;
- **nonfinite_not_from_scale** (NaN while the finite gradients had >= margin binades of room, or Inf while
  they had >= margin + ``far_binades``): not explained by the measured gradients: a bad batch, a forward
  overflow, or an intermediate of backward larger than every parameter gradient that overflowed (into NaN:
  inf - inf inside a matmul). The step is skipped as always. When every gradient is non-finite (a NaN loss),
  the room is that of the last clean step's amax at the current scale and the backoff is bounded: never more
  than ``nonfinite_backoff_binades`` below the scale before the run of such steps (nor, when the policy had
  just raised the scale, below the last clean step's), so a burst of them does not collapse the scale into
  underflow. When some gradients are finite, the scale halves every step, as GradScaler's does (above the last
  clean step's scale, which the policy raised untested: 1, 2, 4, ... binades a step, down to that scale).
  After ``patience`` non-finite steps in a row the policy stops believing the scale is innocent and backs off
  as for an overflow;
- **margin**, learned from NaN: when such a run ends with a clean step at a scale lower than the lowest one
  that failed, the scale caused it after all (``ScaleDecision.unsafe_scale`` names the failing scale). The
  margin becomes one binade more than the room at that scale, so the next scale stays below it: the first
  time for ``growth_interval`` clean steps (a bad batch followed by a good one looks the same, and GradScaler
  too waits that long before growing back), from the second time for the rest of the run. A run whose last
  failing scale also ran clean (a NaN burst at one scale) teaches nothing;
- **no_data** (a clean step whose gradients are all zero: nothing to measure): the scale grows by
  ``growth_factor`` once per ``growth_interval`` such steps in a row, never faster than GradScaler.

Scales are powers of two (unscaling is exact), within [min_scale, max_scale]. The policy is pure host
arithmetic on four numbers per step (``StepStats``); it never touches a device. Distributed runs: the caller
passes statistics combined over every rank, so every rank computes the same decision.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from amp_inspect.core.advice import Advice
from amp_inspect.core.formats import FORMAT_BOUNDS, float32_from_bits
from amp_inspect.core.printable import shown_name
from amp_inspect.evidence.headroom import doublings_below
from amp_inspect.scaling._checked import loss_scale, positive_number, whole_number

DEFAULT_GROWTH_INTERVAL = 2000  # GradScaler's

START = "start"
HEADROOM = "headroom"
MARGIN = "margin"
OVERFLOW = "overflow"
NONFINITE_NOT_FROM_SCALE = "nonfinite_not_from_scale"
NO_DATA = "no_data"
REASONS = (START, HEADROOM, MARGIN, OVERFLOW, NONFINITE_NOT_FROM_SCALE, NO_DATA)
# Skip kinds: why a skipped step was skipped.
SKIP_OVERFLOW = "overflow"
SKIP_NONFINITE = "nonfinite_not_from_scale"


@dataclass(frozen=True)
class StepStats:
    """What the policy reads of one step, combined over all gradients (and ranks)."""

    scale: float  # the loss scale the step ran at
    amax: float  # largest finite |scaled grad| (0 when none is finite and nonzero)
    nan: int  # NaN count
    inf: int  # +-Inf count
    offenders: tuple[str, ...] = ()  # modules with NaN/Inf (for the explanation only)


@dataclass(frozen=True)
class ScaleDecision:
    """One update's decision: the next scale and why."""

    scale: float  # the scale chosen for the next step
    previous: float  # the scale the step ran at
    reason: str  # one of REASONS
    skip: str | None  # None (the step was applied), SKIP_OVERFLOW or SKIP_NONFINITE
    margin: int = 0  # binades kept under the ceiling after this decision
    room: int | None = None  # measured doublings before the largest finite scaled |grad| overflows (None: no data)
    room_from: str | None = None  # "this step" or "last clean step" (all gradients non-finite)
    offenders: tuple[str, ...] = field(default_factory=tuple)
    unsafe_scale: float | None = None  # a scale whose NaN/Inf vanished at this (lower) one: margin learned
    policy: str = "headroom"  # the name of the policy that decided (a log written before it was recorded: headroom)

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["offenders"] = list(self.offenders)
        return record

    def __str__(self) -> str:
        change = self.scale / self.previous if self.previous > 0 else math.nan
        # A decision read from a log carries the log's strings: escaped as names are (printable.shown_name).
        text = f"next loss scale {self.scale:g} (x{change:g}): {shown_name(self.reason)}"
        if self.room is not None:
            room_from = shown_name(str(self.room_from))
            text += f", {self.room:+d} binades of measured room ({room_from}), margin {self.margin}"
        if self.unsafe_scale is not None:
            text += (
                f"; the NaN/Inf at scale {self.unsafe_scale:g} vanished at {self.previous:g}: taken as the scale's "
                "doing (a one-off spike looks the same)"
            )
        if self.skip == SKIP_NONFINITE:
            shown = ", ".join(map(shown_name, self.offenders[:5])) or "all gradients"
            text += f"; step skipped: non-finite, not explained by the measured gradients ({shown})"
        elif self.skip == SKIP_OVERFLOW:
            text += "; step skipped: overflow caused by the scale"
        return text


@dataclass(frozen=True)
class RunFacts:
    """What a policy's ``advice`` reads of a run (history.summarize fills it; torch-free)."""

    decisions: Sequence[tuple[int, ScaleDecision]]  # (step, decision) of the decisions shown on the timeline
    last: ScaleDecision  # the run's latest decision
    blame: str  # where the skipped steps' NaN/Inf started, in words
    source_hint: str  # where to look for the source of NaN/Inf, in words
    clean_after: frozenset[int]  # steps followed by a step that was not skipped
    min_down: int | None  # the fewest halvings of headroom below, over the run (None: not measured)
    fp16: bool  # the run's autocast is fp16


def _largest_fall(decisions: Sequence[tuple[int, ScaleDecision]]) -> float:
    """The largest factor the scale fell by over a run of consecutive steps among ``decisions`` ((step, decision),
    in step order): the scale before the run's first step over the scale after its last."""
    largest, start = 1.0, 0
    for i, (step, decision) in enumerate(decisions):
        if i > 0 and step != decisions[i - 1][0] + 1:
            start = i
        first = decisions[start][1].previous
        if decision.scale > 0:
            largest = max(largest, first / decision.scale)
    return largest


@runtime_checkable
class ScalePolicy(Protocol):
    """What InspectingGradScaler needs of a loss-scale policy (see the module docstring)."""

    name: str

    def first_scale(self, init_scale: float) -> float: ...

    def decide(
        self, s: StepStats, growth_factor: float, backoff_factor: float, growth_interval: int
    ) -> ScaleDecision: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


REQUIRED = ("first_scale", "decide", "state_dict", "load_state_dict")
_REGISTRY: dict[str, type] = {}


def checked_policy(policy: Any, owner: str) -> ScalePolicy:
    """``policy`` when it is a ScalePolicy object, else TypeError in one sentence naming what it lacks."""
    if isinstance(policy, type):
        raise TypeError(f"{owner}: policy must be a policy object, got the class {policy.__name__} (call it first)")
    missing = [name for name in REQUIRED if not callable(getattr(policy, name, None))]
    name = getattr(policy, "name", None)
    if not isinstance(name, str) or not name or name == "torch":
        missing.insert(0, "name (a str other than 'torch')")
    if missing:
        raise TypeError(
            f"{owner}: policy {type(policy).__name__} is not a ScalePolicy: it lacks {', '.join(missing)} "
            f"(a ScalePolicy has name, {', '.join(REQUIRED)}: amp_inspect/scaling/policies.py)"
        )
    return policy


def register_policy(cls: type) -> type:
    """Files a policy class under ``cls.name`` (a class decorator), so that summaries and reports of a run log
    name its decisions in its words; the scaler's ``policy="<name>"`` then builds ``cls()``. The class must have
    the ScalePolicy methods, and its name must not be taken: a second class under one name would change the words
    of every log of the first (the built-in "headroom" too). The same class defined again (its module reloaded,
    a notebook cell run again) replaces itself."""
    if not isinstance(cls, type):
        raise TypeError(
            f"register_policy: expected a policy class, got an instance of {type(cls).__name__} (register its class)"
        )
    if not isinstance(getattr(cls, "name", None), str) or cls.name in ("", "torch"):
        raise ValueError(f"register_policy: {cls.__name__}.name must be a str other than '' and 'torch'")
    missing = [name for name in REQUIRED if not callable(getattr(cls, name, None))]
    if missing:
        raise TypeError(
            f"register_policy: {cls.__name__} is not a ScalePolicy: it lacks {', '.join(missing)} (a ScalePolicy "
            f"has name, {', '.join(REQUIRED)}: amp_inspect/scaling/policies.py)"
        )
    taken = _REGISTRY.get(cls.name)
    if taken is not None and _where(taken) != _where(cls):
        raise ValueError(
            f"register_policy: the name {cls.name!r} of {_where(cls)} is taken by {_where(taken)}; give the policy "
            "a name of its own"
        )
    _REGISTRY[cls.name] = cls
    return cls


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def policy_label(policy: Any) -> str:
    """How a refusal names a policy object: its name and its class (``'halve' (HalveOnNonfinite)``)."""
    name = getattr(policy, "name", None)
    return f"{name!r:.60} ({type(policy).__name__})" if isinstance(name, str) else type(policy).__name__


def registered_policies() -> tuple[str, ...]:
    return tuple(_REGISTRY)


def policy_class(name: str) -> type | None:
    """The registered class of the policy named ``name``, or None (unknown here: its module is not imported)."""
    return _REGISTRY.get(name)


def reason_words(policy: str, reason: str) -> str:
    """The words for a decision's reason under ``policy``; the reason itself when the policy is unknown."""
    return getattr(policy_class(policy), "reason_words", {}).get(reason, reason)


def skip_words(policy: str, skip: str) -> str:
    return getattr(policy_class(policy), "skip_words", {}).get(skip, skip)


def is_routine(policy: str, reason: str) -> bool:
    """Whether decisions for ``reason`` are the policy's routine moves (listed after the others)."""
    return reason in getattr(policy_class(policy), "routine", ())


def policy_advice(policy: str, facts: RunFacts) -> list[str]:
    """What the policy's decisions say about a run (none for a policy without ``advice`` or unknown here)."""
    advice: Callable[[RunFacts], list[str]] | None = getattr(policy_class(policy), "advice", None)
    return [] if advice is None else list(advice(facts))


@register_policy
class HeadroomPolicy:
    """Decides the next loss scale from a step's measured statistics (see the module docstring)."""

    name: ClassVar[str] = "headroom"
    reason_words: ClassVar[Mapping[str, str]] = {
        START: "start: set from the first measured step",
        HEADROOM: "headroom: set from the measured room",
        MARGIN: "margin widened: an overflow with measured room left, or NaN/Inf gone at a lower scale",
        OVERFLOW: "overflow caused by the scale",
        # Not "caused by the scale" nor "not caused": the measured gradients had room, so they do not explain it (a
        # bad batch, a forward overflow, a loss spike times the scale, a hidden intermediate of backward).
        NONFINITE_NOT_FROM_SCALE: "non-finite, not explained by the measured gradients",
        NO_DATA: "no data: every gradient zero",
    }
    skip_words: ClassVar[Mapping[str, str]] = {
        SKIP_OVERFLOW: "overflow (the scale)",
        SKIP_NONFINITE: "non-finite, not explained by the measured gradients",
    }
    routine: ClassVar[tuple[str, ...]] = (HEADROOM,)  # plain headroom moves: shown after the rest

    def __init__(
        self,
        *,
        fmt: str = "fp16",
        margin: int = 2,
        max_margin: int = 10,
        far_binades: int = 8,
        nonfinite_backoff_binades: int = 1,
        patience: int = 8,
        probe_scale: float = 1.0,
        min_scale: float = 2.0**-24,
        max_scale: float = 2.0**32,
    ) -> None:
        options = dict(
            fmt=fmt,
            margin=margin,
            max_margin=max_margin,
            far_binades=far_binades,
            nonfinite_backoff_binades=nonfinite_backoff_binades,
            patience=patience,
            probe_scale=probe_scale,
            min_scale=min_scale,
            max_scale=max_scale,
        )
        # Run state (state_dict): whether a clean step has set the scale yet, the unscaled amax of the last
        # clean step, the scale before the current run of non-finite steps and that run's length.
        # What the policy learns from NaN (see the module docstring): the scale of the last clean step, the
        # current run's lowest failing scale and whether the gradients left any of its steps unexplained; the
        # margin the last evidence against a scale asks for and the clean steps it still lasts; how many pieces
        # of evidence were seen; clean all-zero steps in a row.
        learned = dict(
            ref_scale=None,
            run_lowest=None,
            run_lowest_room=None,
            run_unexplained=False,
            evidence_margin=0,
            evidence_left=0,
            evidence_seen=0,
            no_data_run=0,
        )
        state = dict(calibrated=False, ref_amax=None, anchor=None, nonfinite_run=0, **learned)
        self._set(self._checked({**options, **state}, "HeadroomPolicy"))

    @staticmethod
    def _checked(values: dict[str, Any], owner: str) -> dict[str, Any]:
        """``values`` (every option and state field) checked and converted, or ValueError naming the first bad one:
        the constructor and load_state_dict share it, so a state dict is loaded whole or not at all."""
        fmt = values["fmt"]
        if not isinstance(fmt, str) or fmt not in FORMAT_BOUNDS:
            raise ValueError(f"{owner}: fmt must be one of {sorted(FORMAT_BOUNDS)}, got {fmt!r:.60}")
        out = dict(values)
        out["max_margin"] = whole_number(owner, "max_margin", values["max_margin"], 0)
        out["margin"] = whole_number(owner, "margin", values["margin"], 0, out["max_margin"])
        for name in ("far_binades", "nonfinite_backoff_binades", "patience"):
            out[name] = whole_number(owner, name, values[name], 0)
        for name in ("probe_scale", "min_scale", "max_scale"):  # each may become the scale of a step
            out[name] = loss_scale(owner, name, values[name])
        if out["min_scale"] > out["max_scale"]:
            raise ValueError(f"{owner}: min_scale ({out['min_scale']:g}) is above max_scale ({out['max_scale']:g})")
        for name in ("calibrated", "run_unexplained"):
            if not isinstance(values[name], bool):
                raise ValueError(f"{owner}: {name} must be True or False, got {values[name]!r:.60}")
        if values["ref_amax"] is not None:  # None until measured; an amax may be 0
            out["ref_amax"] = positive_number(owner, "ref_amax", values["ref_amax"], zero_ok=True)
        for name in ("anchor", "ref_scale", "run_lowest"):  # scales steps ran at
            if values[name] is not None:
                out[name] = loss_scale(owner, name, values[name])
        if values["run_lowest_room"] is not None:  # measured room: any whole number of binades, also negative
            out["run_lowest_room"] = whole_number(owner, "run_lowest_room", values["run_lowest_room"], -(2**10))
        for name in ("nonfinite_run", "evidence_margin", "evidence_left", "evidence_seen", "no_data_run"):
            out[name] = whole_number(owner, name, values[name], 0)
        return out

    def _set(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            setattr(self, key, value)
        self.ceiling = float32_from_bits(FORMAT_BOUNDS[self.fmt].overflow_from)  # scaled |grad| >= this overflows

    def first_scale(self, init_scale: float) -> float:
        """The scale of the first step: no higher than the probe, where nothing overflows that a scale can fix."""
        return self._clamp(min(init_scale, self.probe_scale))

    def _clamp(self, scale: float) -> float:
        """The power of two nearest ``scale`` within [min_scale, max_scale]: rounding in binades must not step
        past max_scale (3e38 would round to 2**128, Inf in float32); when no power of two lies within, the one
        below max_scale."""
        exponent = round(math.log2(min(max(scale, self.min_scale), self.max_scale)))
        mantissa, low = math.frexp(self.min_scale)
        if mantissa == 0.5:  # min_scale is 2**(low - 1)
            low -= 1
        exponent = min(max(exponent, low), math.frexp(self.max_scale)[1] - 1)
        return math.ldexp(1.0, exponent)

    def _room(self, amax_scaled: float) -> int:
        return doublings_below(amax_scaled, self.ceiling)

    def decide(
        self,
        s: StepStats,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    ) -> ScaleDecision:
        """The next scale after a step that ran at ``s.scale`` and measured ``s``; updates the run state.
        ``growth_interval`` (GradScaler's): the clean steps that an all-zero stretch waits per growth, and that
        a first piece of evidence against a scale lasts."""
        scale = s.scale
        if not (math.isfinite(scale) and scale > 0):  # a broken scale (the report says so): start again
            self.calibrated, self.anchor, self.nonfinite_run = False, None, 0
            self.run_lowest, self.run_lowest_room, self.run_unexplained = None, None, False
            return self._decision(self.probe_scale, scale, START, None, None, None, s)
        finite_amax = s.amax if 0.0 < s.amax < math.inf else 0.0
        if s.nan == 0 and s.inf == 0:
            return self._clean(s, finite_amax, growth_factor, growth_interval)

        # A non-finite step: skipped. Was the scale the cause?
        self.no_data_run = 0
        self.nonfinite_run += 1
        if self.anchor is None:
            self.anchor = scale
        room, room_from = None, None
        if finite_amax > 0.0:
            room, room_from = self._room(finite_amax), "this step"
        elif self.ref_amax is not None:
            room, room_from = self._room(self.ref_amax * scale), "last clean step"
        if self.run_lowest is None or scale <= self.run_lowest:
            self.run_lowest, self.run_lowest_room = scale, room if room_from == "this step" else None
        backoff = scale * backoff_factor
        margin = self.effective_margin
        if room is None or self.nonfinite_run > self.patience:
            return self._decision(backoff, scale, OVERFLOW, SKIP_OVERFLOW, room, room_from, s)
        if (s.nan > 0 and room >= margin) or room >= margin + self.far_binades:
            # Not explained by the measured gradients. When some gradients were finite, an intermediate of
            # backward larger than every parameter gradient may have overflowed (into NaN: inf - inf in a
            # matmul): keep halving, as GradScaler does, until a step is clean (which then learns the margin,
            # in _clean). So too when the run began at a scale raised since the last clean step, down to that
            # step's scale. Otherwise (no finite gradient: a NaN loss) the backoff is bounded.
            self.run_unexplained = True
            floor = math.ldexp(self.anchor, -self.nonfinite_backoff_binades)
            if room_from == "this step":
                floor = backoff
                if self.ref_scale is not None and scale > self.ref_scale:
                    # Above the last clean step's scale (the policy raised it untested): 1, 2, 4, ... binades
                    # per step, never below that scale, so a long way up costs few skips on the way down.
                    floor = max(scale * backoff_factor ** (2 ** (self.nonfinite_run - 1)), self.ref_scale)
                    backoff = min(backoff, floor)
            elif self.ref_scale is not None and self.anchor > self.ref_scale:
                floor = max(backoff, min(floor, self.ref_scale))
            chosen = min(scale, max(backoff, floor))
            return self._decision(chosen, scale, NONFINITE_NOT_FROM_SCALE, SKIP_NONFINITE, room, room_from, s)
        if room >= margin:  # overflow with measured room left: a hidden gradient is larger
            self.margin = min(room + 1, self.max_margin)
            chosen = min(backoff, math.ldexp(scale, room - self.effective_margin))
            return self._decision(chosen, scale, MARGIN, SKIP_OVERFLOW, room, room_from, s)
        chosen = min(backoff, math.ldexp(scale, room - margin))
        return self._decision(chosen, scale, OVERFLOW, SKIP_OVERFLOW, room, room_from, s)

    @property
    def effective_margin(self) -> int:
        """The margin kept now: the learned one, or the one the last evidence against a scale asks for while
        that evidence lasts."""
        return max(self.margin, self.evidence_margin) if self.evidence_left > 0 else self.margin

    def _clean(self, s: StepStats, finite_amax: float, growth_factor: float, growth_interval: int) -> ScaleDecision:
        """A clean step: the scale from its measured room, after what the run of non-finite steps before it
        (if any) showed."""
        scale = s.scale
        lowest, lowest_room, unexplained = self.run_lowest, self.run_lowest_room, self.run_unexplained
        self.anchor, self.nonfinite_run, self.run_unexplained = None, 0, False
        self.run_lowest = self.run_lowest_room = None
        if self.evidence_left > 0:
            self.evidence_left -= 1
        if finite_amax == 0.0:  # every gradient zero: nothing to measure; grow no faster than GradScaler would
            self.no_data_run += 1
            if self.no_data_run < growth_interval:
                return self._decision(scale, scale, NO_DATA, None, None, None, s)
            self.no_data_run = 0
            return self._decision(scale * growth_factor, scale, NO_DATA, None, None, None, s)
        self.no_data_run = 0
        room = self._room(finite_amax)
        self.ref_amax, self.ref_scale = finite_amax / scale, scale
        reason = HEADROOM if self.calibrated else START
        self.calibrated = True
        unsafe = None
        if unexplained and lowest is not None and scale < lowest:
            # NaN/Inf the gradients did not explain, gone at a lower scale: evidence that the scale caused it.
            # The margin that keeps the scale below the lowest failing one: one binade more than the room at
            # it, as an overflow with room left teaches. The first time for growth_interval clean steps (a
            # bad batch followed by a good one looks the same; GradScaler, too, waits that long to grow
            # back), the second time for the rest of the run.
            # The room there: as this step measures it, or as the failing step measured its finite gradients
            # (the larger: gradients vary from batch to batch).
            at_lowest = room - round(math.log2(lowest / scale))
            if lowest_room is not None:
                at_lowest = max(at_lowest, lowest_room)
            needed = min(at_lowest + 1, self.max_margin)
            if needed > self.effective_margin:
                unsafe, reason = lowest, MARGIN
                if self.evidence_seen:
                    self.margin = max(self.margin, needed)
                else:
                    self.evidence_margin, self.evidence_left = needed, growth_interval
                self.evidence_seen += 1
        next_scale = math.ldexp(scale, room - self.effective_margin)
        return self._decision(next_scale, scale, reason, None, room, "this step", s, unsafe)

    def _decision(
        self,
        scale: float,
        previous: float,
        reason: str,
        skip: str | None,
        room: int | None,
        room_from: str | None,
        s: StepStats,
        unsafe: float | None = None,
    ) -> ScaleDecision:
        margin = self.effective_margin
        return ScaleDecision(self._clamp(scale), previous, reason, skip, margin, room, room_from, s.offenders, unsafe)

    _STATE = ("margin", "calibrated", "ref_amax", "anchor", "nonfinite_run")
    # Added later: a state_dict saved before them loads, with their starting values.
    _LEARNED = (
        "ref_scale",
        "run_lowest",
        "run_lowest_room",
        "run_unexplained",
        "evidence_margin",
        "evidence_left",
        "evidence_seen",
        "no_data_run",
    )
    _OPTIONS = ("fmt", "max_margin", "far_binades", "nonfinite_backoff_binades", "patience", "probe_scale")
    _OPTIONS += ("min_scale", "max_scale")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE + self._LEARNED + self._OPTIONS}

    def checked_state(self, state: Any) -> dict[str, Any]:
        """The options and run state ``load_state_dict(state)`` would set, checked; ValueError (or KeyError for a
        missing run-state field) before anything is set."""
        owner = "HeadroomPolicy.load_state_dict"
        if not isinstance(state, dict):
            raise ValueError(f"{owner}: the state must be a dict, got {type(state).__name__}")
        missing = [k for k in self._STATE if k not in state]
        if missing:
            raise KeyError(f"{owner}: the state lacks {', '.join(missing)}")
        return self._checked(
            {**self.state_dict(), **{k: state[k] for k in self._STATE + self._LEARNED + self._OPTIONS if k in state}},
            owner,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Sets the options and run state of ``state`` (from ``state_dict``): all of them, or, when any is bad, none."""
        self._set(self.checked_state(state))

    @staticmethod
    def advice(facts: RunFacts) -> list[Advice]:
        """What the headroom policy's decisions say about a run (the measured exponents set the scale, so
        GradScaler's init_scale, growth_interval and backoff_factor are not what to change)."""
        advice: list[str] = []
        margin = facts.last.margin
        innocent = [(step, d) for step, d in facts.decisions if d.reason == NONFINITE_NOT_FROM_SCALE]
        if innocent:
            if all(step in facts.clean_after for step, _ in innocent):
                what = (
                    "each one step alone, a clean step after it: a one-off (a spike in the loss, a bad batch); "
                    "whether the scale times that spike overflowed cannot be told from NaN gradients"
                )
            else:
                fall = _largest_fall(innocent)
                what = (
                    "the headroom policy skipped them without collapsing the scale"
                    if fall <= 2.0
                    else f"the scale fell x{fall:g} over such a run of steps (halved each step, as GradScaler's, "
                    "where some gradients stayed finite: a hidden intermediate of backward the scale overflowed "
                    "looks the same), and came back once steps ran clean"
                )
                what += "; no scaler setting fixes them"
            advice.append(
                Advice(
                    f"{len(innocent)} skipped steps (first: step {innocent[0][0]}) held NaN/Inf that the measured "
                    f"gradients do not explain (started in {facts.blame})",
                    f"{what}. Look for the source ({facts.source_hint})",
                    steps=[step for step, _ in innocent],
                )
            )
        # Widened after an overflow with measured room (a hidden gradient overflowed: kept for the run), or after
        # NaN/Inf that vanished at a lower scale (a lesson: the first lasts growth_interval clean steps, the second
        # the run; a one-off spike followed by a clean step at the lower scale teaches the first one too).
        overflowed = [step for step, d in facts.decisions if d.reason == MARGIN and d.unsafe_scale is None]
        learned = [step for step, d in facts.decisions if d.reason == MARGIN and d.unsafe_scale is not None]
        if overflowed or len(learned) >= 2:
            widened = sorted(overflowed + learned)
            advice.append(
                Advice(
                    f"the policy widened its margin {len(widened)} time(s) (first at step {widened[0]}), to {margin} "
                    "binades under the format's ceiling",
                    "a gradient inside backward, larger than the parameter gradients it measures, overflowed. It "
                    f"keeps that margin for the run (state_dict); HeadroomPolicy(margin={margin}) starts a new run "
                    "with it",
                    steps=widened,
                )
            )
        elif learned:
            advice.append(
                Advice(
                    f"at step {learned[0]} the policy widened its margin for a while: the NaN/Inf of the steps "
                    "before it vanished at a lower scale",
                    "it keeps the wider margin for as many clean steps as the scaler's growth interval, and for the "
                    "run only if it happens again. A one-off loss spike or bad batch looks the same; nothing to "
                    "change unless it recurs",
                    steps=learned,
                )
            )
        overflows = [step for step, d in facts.decisions if d.skip == SKIP_OVERFLOW and d.reason != MARGIN]
        if len(overflows) >= 3:
            advice.append(
                Advice(
                    f"{len(overflows)} steps (first: step {overflows[0]}) overflowed at the scale the policy chose",
                    f"the gradients grew by more than its margin of {margin} binades from one step to the next; a "
                    f"wider margin (HeadroomPolicy(margin={margin + 1})) trades a little underflow for fewer skips",
                    steps=overflows,
                )
            )
        if facts.min_down is not None and facts.min_down < 0 and facts.fp16:
            advice.append(
                Advice(
                    f"small gradients underflow to zero even at the scales the policy chose ({facts.min_down} "
                    f"halvings of headroom below) while it keeps {margin} binades under the ceiling",
                    "the gradients span more than the format's range; bf16 autocast (no loss scale needed) keeps them",
                )
            )
        return advice
