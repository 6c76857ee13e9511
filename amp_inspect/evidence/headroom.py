"""Headroom: how far the loss scale sits from a format's edges, and the scale that balances the two margins.

Terms (gradients/step_report.py defines the judged picture; core/formats.py overflow and underflow): ``up`` = how many
times the loss scale could double before the largest scaled |grad| would overflow the format; ``down`` = how many times
it could halve before the smallest nonzero scaled |grad| would underflow to zero. Negative when already past
the edge. The recommended scale is the power of two that shares the two margins equally, lowered where needed
so that the largest gradient does not overflow (when the gradients span more than the format's range,
overflow costs whole steps and comes first).

Plain host arithmetic on a few floats, torch-free: StepReport (device statistics), the run-log readers and the
loss-scale policy share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from amp_inspect.core.formats import FORMAT_BOUNDS, float32_from_bits


@dataclass(frozen=True)
class Headroom:
    up: int | None  # doublings of the loss scale before the largest scaled |grad| overflows
    down: int | None  # halvings before the smallest nonzero scaled |grad| underflows to zero

    def __str__(self) -> str:
        if self.up is None:
            return "no finite nonzero gradient"
        return f"{self.up:+d} doublings before overflow, {self.down:+d} halvings before underflow"


def doublings_below(value: float, limit: float) -> int:
    """The largest k with value * 2^k < limit (value > 0)."""
    k = math.floor(math.log2(limit / value))
    while math.ldexp(value, k) >= limit:
        k -= 1
    while math.ldexp(value, k + 1) < limit:
        k += 1
    return k


def halvings_above(value: float, floor: float) -> int:
    """The largest k with value * 2^-k > floor (value > 0)."""
    k = math.floor(math.log2(value / floor))
    while math.ldexp(value, -k) <= floor:
        k -= 1
    while math.ldexp(value, -(k + 1)) > floor:
        k += 1
    return k


def measure_headroom(largest: float, smallest: float, fmt: str) -> Headroom:
    """The headroom of scaled gradients whose largest finite |v| is ``largest`` and smallest finite nonzero |v|
    ``smallest``, in format ``fmt``; Headroom(None, None) when either is not a finite positive number."""
    # float32 extremes of float64 gradients can round to 0 or Inf: no margin is defined then.
    if not (0.0 < largest < math.inf and 0.0 < smallest < math.inf):
        return Headroom(None, None)
    bounds = FORMAT_BOUNDS[fmt]
    up = doublings_below(largest, float32_from_bits(bounds.overflow_from))
    down = halvings_above(smallest, float32_from_bits(bounds.zero_upto))
    return Headroom(up, down)


def balanced_scale(room: Headroom, scale: float | None) -> float | None:
    """The power of two that gives overflow and underflow equal margins at ``room`` measured at ``scale``
    (None without data)."""
    if room.up is None or room.down is None:
        return None
    current = scale or 1.0
    # Share the margins equally, but never at a scale where the largest gradient overflows: when the
    # gradients span more than the format's range, avoiding overflow (skipped steps) comes first.
    shift = min((room.up - room.down) // 2, room.up)
    return math.ldexp(1.0, round(math.log2(current)) + shift)
