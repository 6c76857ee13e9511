"""The low-precision formats amp_inspect judges values against, and what its terms mean.

For a value v and a format f, "cast" means what ``v.to(dtype)`` does: round to nearest, ties to even.

- **overflow**: v is finite and its cast to f is +-Inf. fp8 e4m3fn has no Inf; there, |v| > 464 counts
  (torch >= 2.13 saturates such values to 448, older torch gives NaN).
- **subnormal**: v is finite, nonzero, and its cast is a nonzero subnormal of f (precision is being lost).
- **underflow**: v is finite, nonzero, and its cast is zero (the value is lost).

The thresholds are exact float32 bit patterns of |v| (docs/numerics.md, checked against torch's casts
by the tests); the kernels compare bits as integers, so flush-to-zero modes cannot change a count.

Torch-free (plain numbers), so the log readers, the figures and the loss-scale policy use the bounds without
loading torch.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The exponent histogram every statistic carries (csrc/tensor_stats/tensor_stats.h kHistBins): one bin per value of
# a float32's exponent field, (bits >> 23) & 0xFF, so bin 127 holds [1, 2), bin 0 zeros and float32 subnormals, bin
# 255 Inf and NaN.
HIST_BINS = 256
EXPONENT_BIAS = 127
ZERO_BIN = 0
NONFINITE_BIN = HIST_BINS - 1


@dataclass(frozen=True)
class FormatBounds:
    """Where a format's casts change category, as bit patterns of |v|: of a float32 (the values the kernels
    judge after a scale, and fp16/bf16/fp32 inputs) and of a float64 holding the same real value (unscaled
    float64 inputs are judged on their own bits)."""

    name: str
    dtype_name: str  # the torch dtype attribute this format is, for oracles and messages
    max_finite: float
    overflow_from: int  # |v| >= this overflows
    normal_from: int  # |v| >= this casts to a normal number (or overflows)
    zero_upto: int  # |v| <= this casts to zero
    overflow_from64: int  # the same three bounds as float64 bit patterns
    normal_from64: int
    zero_upto64: int

    @property
    def bits(self) -> tuple[int, int, int, int, int, int]:
        """The six bounds in the order of tensor_stats.h's ``FormatBounds`` (what ``_C.layout()`` gives)."""
        return (
            self.overflow_from,
            self.normal_from,
            self.zero_upto,
            self.overflow_from64,
            self.normal_from64,
            self.zero_upto64,
        )

    @property
    def dtype(self) -> torch.dtype | None:
        """The torch dtype (None where this torch lacks it); imports torch."""
        import torch

        return getattr(torch, self.dtype_name, None)


def float32_from_bits(bits: int) -> float:
    """The float32 whose bit pattern is ``bits``, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def float64_from_bits(bits: int) -> float:
    """The float64 whose bit pattern is ``bits`` (exact)."""
    return struct.unpack("<d", struct.pack("<Q", bits))[0]


# The Python copy of csrc/tensor_stats/tensor_stats.h's kFormatBounds and kFormatNames, in FormatId
# order. The compiled table is the source: amp_inspect._C.layout() hands it over, the extension is refused at
# load time when the two differ (statistics.layout_problem), and tests/test_schema.py holds them equal. This
# copy exists because the log readers (torch-free) and the pure-torch fallback (no _C) need the bounds too.
FORMAT_BOUNDS: dict[str, FormatBounds] = {
    b.name: b
    for b in (
        FormatBounds(
            "fp16", "float16", 65504.0, 0x477FF000, 0x387FE000, 0x33000000,
            0x40EFFE0000000000, 0x3F0FFC0000000000, 0x3E60000000000000,
        ),
        FormatBounds(
            "bf16", "bfloat16", 3.3895313892515355e38, 0x7F7F8000, 0x007F8000, 0x00008000,
            0x47EFF00000000000, 0x380FE00000000000, 0x3790000000000000,
        ),
        # e4m3fn: out of range *above* 464, i.e. from the float32 (float64) after 464.
        FormatBounds(
            "fp8_e4m3", "float8_e4m3fn", 448.0, 0x43E80001, 0x3C700000, 0x3A800000,
            0x407D000000000001, 0x3F8E000000000000, 0x3F50000000000000,
        ),
        FormatBounds(
            "fp8_e5m2", "float8_e5m2", 57344.0, 0x47700000, 0x38600000, 0x37000000,
            0x40EE000000000000, 0x3F0C000000000000, 0x3EE0000000000000,
        ),
    )
}  # fmt: skip

FORMATS: tuple[str, ...] = tuple(FORMAT_BOUNDS)


def check_formats(formats: object) -> tuple[str, ...]:
    """Returns ``formats`` as a tuple of known, distinct names, or raises a ValueError/TypeError saying why."""
    if isinstance(formats, str):
        formats = (formats,)
    try:
        names = tuple(formats)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"formats must be a sequence of format names, got {type(formats).__name__}") from None
    if not names:
        raise ValueError("formats must name at least one format")
    for name in names:
        if name not in FORMAT_BOUNDS:
            raise ValueError(f"unknown format {name!r}; expected one of {', '.join(FORMATS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"formats lists a format twice: {names}")
    return names
