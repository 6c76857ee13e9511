"""One-sentence checks for numeric options, shared by the scaler, the headroom policy and their state dicts.

Each returns the value as the type it must be, or raises ValueError naming the owner, the option, what it
must be and what it got, so ``init_scale=float("nan")`` or ``max_scale=-1`` fails where it is given, not as a
``math domain error`` deep inside a later step. bool is refused where a number is meant (``True`` is an int);
numpy's numbers are numbers. Torch-free.
"""

from __future__ import annotations

import math
import numbers
import struct
from typing import Any

# A loss scale lives in GradScaler's float32 tensor and is unscaled by its float32 reciprocal: from float32's
# smallest normal (below it 1/scale overflows to Inf, or the scale rounds to 0) to its largest finite value.
SMALLEST_SCALE = 2.0**-126


def _as_float(value: Any) -> float | None:
    """``value`` as a float when it is an int, a float or a numpy number (not bool) within float range, else None
    (an int beyond float range would raise OverflowError). Other real numbers (Fraction, Decimal) are refused:
    torch does not take them."""
    numpy_number = isinstance(value, numbers.Real) and type(value).__module__ == "numpy"
    if isinstance(value, bool) or not (isinstance(value, int | float) or numpy_number):
        return None
    try:
        return float(value)
    except (OverflowError, TypeError, ValueError):
        return None


def _as_float32(value: float) -> float:
    """``value`` rounded to float32 (inf where float32 overflows)."""
    return struct.unpack("f", struct.pack("f", value))[0]


def positive_number(owner: str, name: str, value: Any, *, zero_ok: bool = False) -> float:
    """``value`` as a float when it is a finite number above 0 (or 0 itself, with ``zero_ok``); ValueError
    otherwise."""
    number = _as_float(value)
    if number is None or not math.isfinite(number) or number < 0 or (number == 0 and not zero_ok):
        bound = "0 or more" if zero_ok else "above 0"
        raise ValueError(f"{owner}: {name} must be a finite number {bound}, got {value!r:.60}")
    return number


def loss_scale(owner: str, name: str, value: Any) -> float:
    """``value`` as a float when it is a loss scale: a number above 0 that stays finite and normal in float32
    (``1e39`` is finite in float64 and Inf in GradScaler's tensor); ValueError otherwise, with the same words as
    ``positive_number``'s."""
    number = _as_float(value)
    if number is None or not math.isfinite(number) or not SMALLEST_SCALE <= _as_float32(number) < math.inf:
        raise ValueError(
            f"{owner}: {name} must be a finite number above 0, got {value!r:.60} (a loss scale is held in float32: "
            "from 2**-126 to 3.4e+38)"
        )
    return number


def whole_number(owner: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` when it is an int in ``[low, high]`` (no upper bound when ``high`` is None); ValueError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f"from {low} to {high}" if high is not None else f"{low} or more"
        raise ValueError(f"{owner}: {name} must be an integer {span}, got {value!r:.60}")
    return value
