"""Pure-torch reference of the tensor_stats op: same arguments, same outputs.

It is the fallback when the compiled extension cannot load, an oracle for the tests, and a baseline in the
benchmark. It is written for clarity, not speed: it makes temporaries as large as each tensor and runs a
dozen ops per tensor. Definitions of every statistic are in amp_inspect/stats.py and amp_inspect/formats.py.
"""

from __future__ import annotations

import struct

import torch

from .formats import FORMAT_BOUNDS, HIST_BINS

FIXED_COUNT_COLUMNS = 5  # numel, nan, posinf, neginf, zero

_ABS32 = 0x7FFFFFFF
_INF32 = 0x7F800000
_NEG_INF32 = 0xFF800000 - (1 << 32)  # as a signed int32
_ABS64 = 0x7FFFFFFFFFFFFFFF
_INF64 = 0x7FF0000000000000
_NEG_INF64 = 0xFFF0000000000000 - (1 << 64)


def _f32_bits_as_f64_bits(bits: int) -> int:
    """The float64 bit pattern of the float32 whose bits are given (the same real value)."""
    value = struct.unpack("<f", struct.pack("<I", bits))[0]
    return struct.unpack("<q", struct.pack("<d", value))[0]


def _thresholds(formats: list[str], wide: bool) -> list[tuple[int, int, int]]:
    out = []
    for name in formats:
        b = FORMAT_BOUNDS[name]
        if not wide:
            out.append((b.overflow_from, b.normal_from, b.zero_upto))
        elif name == "fp8_e4m3":
            # "above 464" in float64 is from the double after 464, not the float32 after it.
            out.append(
                (
                    _f32_bits_as_f64_bits(0x43E80000) + 1,
                    *map(_f32_bits_as_f64_bits, (b.normal_from, b.zero_upto)),
                )
            )
        else:
            out.append(tuple(map(_f32_bits_as_f64_bits, (b.overflow_from, b.normal_from, b.zero_upto))))
    return out


def _one_tensor(t: torch.Tensor, scale: torch.Tensor | None, formats: list[str]):
    flat = t.detach().reshape(-1)
    wide = flat.dtype == torch.float64 and scale is None
    if wide:
        bits = flat.contiguous().view(torch.int64)
        absolute = bits & _ABS64
        inf, neg_inf = _INF64, _NEG_INF64
        values = flat
        # The histogram is over float32(v); float64 beyond float32's range lands in bin 255.
        hist_bits = flat.float().view(torch.int32)
    else:
        values = flat.float()
        if scale is not None:
            values = values * scale  # one float32 multiply
        bits = values.contiguous().view(torch.int32)
        absolute = bits & _ABS32
        inf, neg_inf = _INF32, _NEG_INF32
        hist_bits = bits
    finite = absolute < inf
    nan = int((absolute > inf).sum())
    posinf = int((bits == inf).sum())
    neginf = int((bits == neg_inf).sum())
    zero = int((absolute == 0).sum())
    non_finite = nan + posinf + neginf
    overflow, subnormal, underflow = [], [], []
    for overflow_from, normal_from, zero_upto in _thresholds(formats, wide):
        at_or_below_zero = int((absolute <= zero_upto).sum())
        overflow.append(int((absolute >= overflow_from).sum()) - non_finite)
        subnormal.append(int((absolute < normal_from).sum()) - at_or_below_zero)
        underflow.append(at_or_below_zero - zero)
    counts = [flat.numel(), nan, posinf, neginf, zero, *overflow, *subnormal, *underflow]

    magnitudes = values.abs()
    finite_magnitudes = magnitudes[finite]
    nonzero_magnitudes = finite_magnitudes[finite_magnitudes != 0]
    amax = float(finite_magnitudes.max()) if finite_magnitudes.numel() else 0.0
    amin = float(nonzero_magnitudes.min()) if nonzero_magnitudes.numel() else float("inf")
    sumsq = float((values[finite].double() ** 2).sum())
    hist = torch.bincount(((hist_bits >> 23) & 0xFF).long(), minlength=HIST_BINS)
    return counts, hist, amax, amin, sumsq


def tensor_stats_reference(
    tensors: list[torch.Tensor],
    scale: torch.Tensor | None,
    scale_value: float | None,
    formats: list[str],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same arguments and outputs as ``torch.ops.amp_inspect.tensor_stats`` (inputs already checked).

    Returns (counts int64 [T, 5 + 3F], hist int64 [T, 256], amax float32 [T], amin_nonzero float32 [T],
    sumsq float64 [T]) on the device of the first tensor (CPU when there is none). Reads values to the host.
    """
    device = tensors[0].device if tensors else torch.device("cpu")
    scale32 = None
    if scale is not None:
        scale32 = scale.detach().reshape(()).to(dtype=torch.float32)
    elif scale_value is not None:
        scale32 = torch.tensor(scale_value, dtype=torch.float32)
    rows = []
    for t in tensors:
        s = None if scale32 is None else scale32.to(t.device)
        rows.append(_one_tensor(t, s, list(formats)))
    columns = FIXED_COUNT_COLUMNS + 3 * len(formats)
    counts = torch.tensor([r[0] for r in rows], dtype=torch.int64).reshape(len(rows), columns)
    hist = torch.stack([r[1].cpu() for r in rows]) if rows else torch.zeros(0, HIST_BINS, dtype=torch.int64)
    amax = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    amin = torch.tensor([r[3] for r in rows], dtype=torch.float32)
    sumsq = torch.tensor([r[4] for r in rows], dtype=torch.float64)
    return tuple(x.to(device) for x in (counts, hist, amax, amin, sumsq))  # type: ignore[return-value]
