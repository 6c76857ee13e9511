"""The headroom loss-scale policy: the next loss scale from the measured exponents of this step's gradients.

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
  they had >= margin + ``far_binades``): a bad batch or a forward overflow, which no loss scale fixes. The
  step is skipped as always, but the backoff is bounded: never more than ``nonfinite_backoff_binades``
  below the scale before the run of such steps, so a burst of them does not collapse the scale into
  underflow. When the step's gradients are all non-finite, the room is that of the last clean step's amax
  at the current scale. After ``patience`` non-finite steps in a row the policy stops believing the scale is
  innocent and backs off as for an overflow.

Scales are powers of two (unscaling is exact), within [min_scale, max_scale]. The policy is pure host
arithmetic on four numbers per step (``StepStats``); it never touches a device. Distributed runs: the caller
passes statistics combined over every rank, so every rank computes the same decision.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .checked import positive_number, whole_number
from .formats import FORMAT_BOUNDS, float32_from_bits
from .headroom import doublings_below
from .printable import shown_name

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
    margin: int  # binades kept under the ceiling after this decision
    room: int | None  # measured doublings before the largest finite scaled |grad| overflows (None: no data)
    room_from: str | None  # "this step" or "last clean step" (all gradients non-finite)
    offenders: tuple[str, ...] = field(default_factory=tuple)

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        record["offenders"] = list(self.offenders)
        return record

    def __str__(self) -> str:
        change = self.scale / self.previous if self.previous > 0 else math.nan
        text = f"next loss scale {self.scale:g} (x{change:g}): {self.reason}"
        if self.room is not None:
            text += f", {self.room:+d} binades of measured room ({self.room_from}), margin {self.margin}"
        if self.skip == SKIP_NONFINITE:
            shown = ", ".join(map(shown_name, self.offenders[:5])) or "all gradients"
            text += f"; step skipped: non-finite not caused by the scale ({shown})"
        elif self.skip == SKIP_OVERFLOW:
            text += "; step skipped: overflow caused by the scale"
        return text


class HeadroomPolicy:
    """Decides the next loss scale from a step's measured statistics (see the module docstring)."""

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
        state = dict(calibrated=False, ref_amax=None, anchor=None, nonfinite_run=0)
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
        for name in ("probe_scale", "min_scale", "max_scale"):
            out[name] = positive_number(owner, name, values[name])
        if out["min_scale"] > out["max_scale"]:
            raise ValueError(f"{owner}: min_scale ({out['min_scale']:g}) is above max_scale ({out['max_scale']:g})")
        if not isinstance(values["calibrated"], bool):
            raise ValueError(f"{owner}: calibrated must be True or False, got {values['calibrated']!r:.60}")
        for name in ("ref_amax", "anchor"):  # None until a clean step measured them; an amax may be 0
            if values[name] is not None:
                out[name] = positive_number(owner, name, values[name], zero_ok=name == "ref_amax")
        out["nonfinite_run"] = whole_number(owner, "nonfinite_run", values["nonfinite_run"], 0)
        return out

    def _set(self, values: dict[str, Any]) -> None:
        for key, value in values.items():
            setattr(self, key, value)
        self.ceiling = float32_from_bits(FORMAT_BOUNDS[self.fmt].overflow_from)  # scaled |grad| >= this overflows

    def first_scale(self, init_scale: float) -> float:
        """The scale of the first step: no higher than the probe, where nothing overflows that a scale can fix."""
        return self._clamp(min(init_scale, self.probe_scale))

    def _clamp(self, scale: float) -> float:
        exponent = round(math.log2(min(max(scale, self.min_scale), self.max_scale)))
        return math.ldexp(1.0, exponent)

    def _room(self, amax_scaled: float) -> int:
        return doublings_below(amax_scaled, self.ceiling)

    def decide(self, s: StepStats, growth_factor: float = 2.0, backoff_factor: float = 0.5) -> ScaleDecision:
        """The next scale after a step that ran at ``s.scale`` and measured ``s``; updates the run state."""
        scale = s.scale
        if not (math.isfinite(scale) and scale > 0):  # a broken scale (the report says so): start again
            self.calibrated, self.anchor, self.nonfinite_run = False, None, 0
            return self._decision(self.probe_scale, scale, START, None, None, None, s)
        finite_amax = s.amax if 0.0 < s.amax < math.inf else 0.0
        if s.nan == 0 and s.inf == 0:
            self.anchor, self.nonfinite_run = None, 0
            if finite_amax == 0.0:  # every gradient zero: nothing to measure; grow as GradScaler would
                return self._decision(scale * growth_factor, scale, NO_DATA, None, None, None, s)
            room = self._room(finite_amax)
            self.ref_amax = finite_amax / scale
            reason = HEADROOM if self.calibrated else START
            self.calibrated = True
            return self._decision(math.ldexp(scale, room - self.margin), scale, reason, None, room, "this step", s)

        # A non-finite step: skipped. Was the scale the cause?
        self.nonfinite_run += 1
        if self.anchor is None:
            self.anchor = scale
        room, room_from = None, None
        if finite_amax > 0.0:
            room, room_from = self._room(finite_amax), "this step"
        elif self.ref_amax is not None:
            room, room_from = self._room(self.ref_amax * scale), "last clean step"
        backoff = scale * backoff_factor
        if room is None or self.nonfinite_run > self.patience:
            return self._decision(backoff, scale, OVERFLOW, SKIP_OVERFLOW, room, room_from, s)
        if (s.nan > 0 and room >= self.margin) or room >= self.margin + self.far_binades:
            floor = math.ldexp(self.anchor, -self.nonfinite_backoff_binades)
            chosen = min(scale, max(backoff, floor))
            return self._decision(chosen, scale, NONFINITE_NOT_FROM_SCALE, SKIP_NONFINITE, room, room_from, s)
        if room >= self.margin:  # overflow with measured room left: a hidden gradient is larger
            self.margin = min(room + 1, self.max_margin)
            chosen = min(backoff, math.ldexp(scale, room - self.margin))
            return self._decision(chosen, scale, MARGIN, SKIP_OVERFLOW, room, room_from, s)
        chosen = min(backoff, math.ldexp(scale, room - self.margin))
        return self._decision(chosen, scale, OVERFLOW, SKIP_OVERFLOW, room, room_from, s)

    def _decision(
        self,
        scale: float,
        previous: float,
        reason: str,
        skip: str | None,
        room: int | None,
        room_from: str | None,
        s: StepStats,
    ) -> ScaleDecision:
        return ScaleDecision(self._clamp(scale), previous, reason, skip, self.margin, room, room_from, s.offenders)

    _STATE = ("margin", "calibrated", "ref_amax", "anchor", "nonfinite_run")
    _OPTIONS = ("fmt", "max_margin", "far_binades", "nonfinite_backoff_binades", "patience", "probe_scale")
    _OPTIONS += ("min_scale", "max_scale")

    def state_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self._STATE + self._OPTIONS}

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
            {**self.state_dict(), **{k: state[k] for k in self._STATE + self._OPTIONS if k in state}}, owner
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Sets the options and run state of ``state`` (from ``state_dict``): all of them, or, when any is bad, none."""
        self._set(self.checked_state(state))
