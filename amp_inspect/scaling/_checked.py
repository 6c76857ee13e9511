"""One-sentence checks for numeric options, shared by the scaler, the headroom policy and their state dicts.

Each returns the value as the type it must be, or raises ValueError naming the owner, the option, what it
must be and what it got, so ``init_scale=float("nan")`` or ``max_scale=-1`` fails where it is given, not as a
``math domain error`` deep inside a later step. bool is refused where a number is meant (``True`` is an int).
Torch-free.
"""

from __future__ import annotations

import math
from typing import Any


def _is_real(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def positive_number(owner: str, name: str, value: Any, *, zero_ok: bool = False) -> float:
    """``value`` as a float when it is a finite number above 0 (or 0 itself, with ``zero_ok``); ValueError
    otherwise."""
    if not _is_real(value) or not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "above 0"
        raise ValueError(f"{owner}: {name} must be a finite number {bound}, got {value!r:.60}")
    return float(value)


def whole_number(owner: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` when it is an int in ``[low, high]`` (no upper bound when ``high`` is None); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise ValueError(f"{owner}: {name} must be an integer {span}, got {value!r:.60}")
    return value
