"""``amp_inspect.tensor_stats``: every numerics statistic of a list of tensors, in one fused pass.

Definitions (v is the value judged: x itself, or ``float32(x) * scale`` as one float32 multiply when a
scale is given; the format terms overflow, subnormal and underflow are defined in amp_inspect/formats.py):

- ``numel``, ``nan``, ``posinf``, ``neginf``, ``zero``: element counts.
- ``overflow``, ``subnormal``, ``underflow``: counts per format, one column per name in ``formats``.
- ``amax``: max |v| over finite v (0 when there is none). ``amin_nonzero``: min |v| over finite nonzero v
  (+inf when there is none). Both float32; a float64 extreme is rounded to float32.
- ``sumsq``: sum of v*v over finite v, relative error below 2e-6 against a float64 sum (squares are summed
  in float32 partial sums of at most 16 terms that are accumulated in float64).
- ``hist``: elements counted by the float32 exponent field of v, ``(bits >> 23) & 0xFF``. Bin 0 holds zeros
  and float32 subnormals, bin 255 Inf and NaN, bin 127 the binade [1, 2). Each row sums to numel. A float64
  v is binned as float32(v), so one beyond float32's range lands in bin 255.

Cost: one read of every element and no temporaries proportional to the number of elements; on CUDA, a
fixed number of kernel launches whatever the number of tensors, and no host sync. Where no compiled kernel
serves the tensors' device (a GPU the binary has no CUDA kernels for, MPS, XPU, ROCm), the pure-torch
fallback of amp_inspect/reference.py gives the same outputs, also without a host sync and with a number of
torch ops that does not depend on the number of tensors, but in several passes (docs/tensor_stats.md).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._ops import tensor_stats_op
from .formats import check_formats
from .reference import FIXED_COUNT_COLUMNS

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Round-to-nearest-even into float32: 2^-150 (half the smallest subnormal) ties to zero, and from
# 2^128 - 2^103 (half an ulp above the largest finite float32) values round to Inf.
FLOAT32_ROUNDS_TO_ZERO_UPTO = 2.0**-150
FLOAT32_ROUNDS_TO_INF_FROM = 2.0**128 - 2.0**103


@dataclass(frozen=True)
class TensorStats:
    """Statistics of T tensors against F formats, as tensors on the inputs' device (read them when you
    need host values; building this object never syncs the host)."""

    numel: torch.Tensor  # int64 [T]
    nan: torch.Tensor  # int64 [T]
    posinf: torch.Tensor  # int64 [T]
    neginf: torch.Tensor  # int64 [T]
    zero: torch.Tensor  # int64 [T]
    overflow: torch.Tensor  # int64 [T, F]
    subnormal: torch.Tensor  # int64 [T, F]
    underflow: torch.Tensor  # int64 [T, F]
    amax: torch.Tensor  # float32 [T]
    amin_nonzero: torch.Tensor  # float32 [T]
    sumsq: torch.Tensor  # float64 [T]
    hist: torch.Tensor  # int64 [T, 256]
    formats: tuple[str, ...]

    @classmethod
    def from_op_outputs(cls, outputs: Sequence[torch.Tensor], formats: tuple[str, ...]) -> TensorStats:
        counts, hist, amax, amin_nonzero, sumsq = outputs
        f = len(formats)
        # Views, two ops whatever F (not one index op per column: the fallback counts its ops).
        fixed, overflow, subnormal, underflow = counts.split([FIXED_COUNT_COLUMNS, f, f, f], 1)
        numel, nan, posinf, neginf, zero = fixed.unbind(1)
        return cls(
            numel=numel,
            nan=nan,
            posinf=posinf,
            neginf=neginf,
            zero=zero,
            overflow=overflow,
            subnormal=subnormal,
            underflow=underflow,
            amax=amax,
            amin_nonzero=amin_nonzero,
            sumsq=sumsq,
            hist=hist,
            formats=formats,
        )

    def __len__(self) -> int:
        return self.numel.shape[0]

    @property
    def nonfinite(self) -> torch.Tensor:
        """NaN + Inf count per tensor (int64 [T])."""
        return self.nan + self.posinf + self.neginf

    @property
    def norm(self) -> torch.Tensor:
        """L2 norm of the finite values per tensor (float64 [T])."""
        return self.sumsq.sqrt()

    def column(self, fmt: str) -> int:
        """The column of ``overflow``/``subnormal``/``underflow`` that holds format ``fmt``."""
        try:
            return self.formats.index(fmt)
        except ValueError:
            raise KeyError(f"format {fmt!r} was not requested; these were: {', '.join(self.formats)}") from None


def stats_outputs(stats: TensorStats) -> tuple[torch.Tensor, ...]:
    """The op's five outputs (counts, hist, amax, amin_nonzero, sumsq) of a TensorStats."""
    counts = torch.cat(
        [
            torch.stack([stats.numel, stats.nan, stats.posinf, stats.neginf, stats.zero], 1),
            stats.overflow,
            stats.subnormal,
            stats.underflow,
        ],
        1,
    )
    return counts, stats.hist, stats.amax, stats.amin_nonzero, stats.sumsq


def _check_scale(scale: object) -> tuple[torch.Tensor | None, float | None]:
    if scale is None:
        return None, None
    if isinstance(scale, torch.Tensor):
        if scale.device.type == "meta" and not torch.compiler.is_compiling():
            raise ValueError("the scale tensor is on the meta device, which holds no value")
        if scale.dtype != torch.float32 or scale.numel() != 1:
            raise TypeError(
                f"a scale tensor must be a float32 tensor of one element, got {scale.dtype} with "
                f"{scale.numel()} elements"
            )
        # On the CPU reading it costs no sync, so check it like a number. Under torch.compile the read would
        # be a data-dependent guard; the op's own check (tensor_stats.cpp) still runs on the real value.
        if scale.device.type == "cpu" and not torch.compiler.is_compiling():
            value = float(scale)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"scale must be finite and positive, got {value}")
        # A device tensor is not read here: that would sync. Its value is the caller's responsibility.
        return scale.detach().reshape(()), None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a float or a float32 tensor, got {type(scale).__name__}")
    value = float(scale)
    # The kernels multiply by float32(scale): it must stay finite and nonzero after that rounding.
    if not (FLOAT32_ROUNDS_TO_ZERO_UPTO < value < FLOAT32_ROUNDS_TO_INF_FROM):
        raise ValueError(f"scale must be finite and positive (as a float32), got {value!r}")
    return None, value


def _check_tensors(tensors: object) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError("tensors must be a list of tensors; wrap a single tensor as [t]")
    try:
        items = list(tensors)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"tensors must be a list of tensors, got {type(tensors).__name__}") from None
    for i, t in enumerate(items):
        if t is None:
            raise TypeError(f"tensor {i} is None (a parameter without a gradient? leave it out of the list)")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {i} is a {type(t).__name__}, not a torch.Tensor")
        if t.is_nested:  # a strided nested tensor claims torch.strided, and the op has no nested kernel
            raise TypeError(f"tensor {i} is a nested tensor; pass its components instead (list(t.unbind()))")
        if t.layout != torch.strided:
            raise TypeError(f"tensor {i} has layout {t.layout}; only dense tensors are supported")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"tensor {i} has dtype {t.dtype}; expected float32, float16, bfloat16 or float64")
    # Fake tensors under torch.compile report their real device; a real meta tensor holds no values.
    meta = [str(i) for i, t in enumerate(items) if t.device.type == "meta"]
    if meta and not torch.compiler.is_compiling():
        raise ValueError(
            f"tensor {', '.join(meta[:8])} {'is' if len(meta) == 1 else 'are'} on the meta device, which holds no "
            "values to inspect (materialise it first, e.g. with to_empty() and an initialisation)"
        )
    return items


def tensor_stats(
    tensors: Sequence[torch.Tensor],
    *,
    scale: float | torch.Tensor | None = None,
    formats: Sequence[str] = ("fp16",),
) -> TensorStats:
    """Counts NaN/Inf/zeros, fp16/bf16/fp8 overflow, subnormal and underflow, extremes, sum of squares and
    an exponent histogram of every tensor in ``tensors``, in one fused pass.

    Args:
        tensors: float32, float16, bfloat16 or float64 tensors, any strides, on CPU and/or CUDA.
        scale: judge ``float32(x) * scale`` instead of x (e.g. a GradScaler's scale, to see unscaled
            gradients as they were in fp16). A positive float, or a 0-dim float32 tensor read on the device.
        formats: any of "fp16", "bf16", "fp8_e4m3", "fp8_e5m2"; one column each in the count matrices.

    Returns the statistics on the device of ``tensors[0]`` (CPU for an empty list). A list of one device
    never syncs the host; a mixed list is run per device, and gathering CUDA results onto a CPU
    ``tensors[0]`` syncs. The caller's tensors are never modified.

    Example::

        stats = amp_inspect.tensor_stats([p.grad for p in model.parameters() if p.grad is not None])
        stats.nan.sum(), stats.overflow[:, 0]  # NaN in all, fp16 overflow per tensor
    """
    items = _check_tensors(tensors)
    names = check_formats(formats)
    scale_tensor, scale_value = _check_scale(scale)
    if not items:
        return TensorStats.from_op_outputs(tensor_stats_op([], None, None, list(names)), names)

    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(items):
        by_device.setdefault(t.device, []).append(i)
    home = items[0].device

    def run(device: torch.device, group: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        s = scale_tensor
        if s is not None and s.device != device:
            # To the host the copy must be complete before the kernel reads it (a copy, not a sync, on CUDA).
            s = s.to(device, non_blocking=device.type != "cpu")
        with torch.no_grad():
            return tensor_stats_op(group, s, scale_value, list(names))

    if len(by_device) == 1:
        return TensorStats.from_op_outputs(run(home, items), names)

    # Mixed devices: one call per device, rows scattered back into caller order on the home device.
    parts = [(rows, run(device, [items[i] for i in rows])) for device, rows in by_device.items()]
    return TensorStats.from_op_outputs(merge_rows(parts, len(items), home), names)


def merge_rows(
    parts: Sequence[tuple[Sequence[int], Sequence[torch.Tensor]]], count: int, home: torch.device
) -> tuple[torch.Tensor, ...]:
    """Op outputs computed per group of rows (``parts``: row indices, outputs), gathered into one set of
    outputs of ``count`` rows on ``home``. Copies to a CUDA home are asynchronous (the row index goes through
    pinned memory); a copy to the host completes before use, which waits for the device."""
    if len(parts) == 1 and list(parts[0][0]) == list(range(count)):
        return tuple(parts[0][1])
    merged = []
    for k in range(len(parts[0][1])):
        template = parts[0][1][k]
        full = torch.empty((count, *template.shape[1:]), dtype=template.dtype, device=home)
        for rows, outputs in parts:
            index = torch.tensor(list(rows), dtype=torch.int64)
            if home.type == "cuda":
                index = index.pin_memory().to(home, non_blocking=True)
            full[index] = outputs[k].to(home, non_blocking=home.type != "cpu")
        merged.append(full)
    return tuple(merged)
