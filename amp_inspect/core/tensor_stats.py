"""``amp_inspect.tensor_stats``: every numerics statistic of a list of tensors, in one fused pass.

Definitions (v is the value judged: x itself, or ``float32(x) * scale`` as one float32 multiply when a
scale is given; the format terms overflow, subnormal and underflow are defined in amp_inspect/core/formats.py):
each statistic is one entry of the schema in amp_inspect/core/statistics.py, with its dtype, shape and how it
merges; ``TensorStats``'s docstring lists them.

Cost: one read of every element and no temporaries proportional to the number of elements; on CUDA, a
fixed number of kernel launches whatever the number of tensors, and no host sync. Where no compiled kernel
serves the tensors' device (a GPU the binary has no CUDA kernels for, MPS, XPU, ROCm), the pure-torch
fallback of amp_inspect/core/references/tensor_stats.py gives the same outputs, also without a host sync and with a
number of torch ops that does not depend on the number of tensors, but in several passes (docs/tensor_stats.md).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch

from amp_inspect.core.formats import HIST_BINS, check_formats
from amp_inspect.core.ops import refuse_nested, tensor_stats_op
from amp_inspect.core.statistics import (
    BY_NAME,
    DERIVED,
    DERIVED_BY_NAME,
    OUTPUTS,
    PER_BIN,
    PER_FORMAT,
    PER_TENSOR,
    STATISTICS,
    Statistic,
    derive,
)

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# Round-to-nearest-even into float32: 2^-150 (half the smallest subnormal) ties to zero, and from
# 2^128 - 2^103 (half an ulp above the largest finite float32) values round to Inf.
FLOAT32_ROUNDS_TO_ZERO_UPTO = 2.0**-150
FLOAT32_ROUNDS_TO_INF_FROM = 2.0**128 - 2.0**103


class TensorStats:
    """Statistics of T tensors against F formats, as tensors on the inputs' device (read them when you
    need host values; building this object never syncs the host). One attribute per statistic of the schema
    (amp_inspect/core/statistics.py), and one per derived value (computed when read); v is the value judged, x or
    ``float32(x) * scale``:"""

    __slots__ = ("_by_name", "formats")

    def __init__(self, formats: Sequence[str], **values: torch.Tensor) -> None:
        missing = [s.name for s in STATISTICS if s.name not in values]
        unknown = [name for name in values if name not in BY_NAME]
        if missing or unknown:
            raise TypeError(f"TensorStats takes every statistic of the schema: missing {missing}, unknown {unknown}")
        object.__setattr__(self, "_by_name", {s.name: values[s.name] for s in STATISTICS})
        object.__setattr__(self, "formats", tuple(formats))

    def __getattr__(self, name: str) -> torch.Tensor:
        if not name.startswith("_"):  # (copy and pickle look up dunders before __init__ has run)
            values = self._by_name
            if name in values:
                return values[name]
            if name in DERIVED_BY_NAME:
                return derive(name, values)
        raise AttributeError(f"TensorStats has no statistic {name!r}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("TensorStats is immutable")

    def __reduce__(self) -> tuple:
        # copy, deepcopy, pickle and torch.save rebuild it through __init__ (its slots are not set directly).
        return (_rebuild, (self.formats, self._by_name))

    def __dir__(self) -> list[str]:
        return sorted({*super().__dir__(), *BY_NAME, *DERIVED_BY_NAME})

    def __repr__(self) -> str:
        return f"TensorStats({len(self)} tensors, formats={self.formats})"

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The statistics by name, in schema order."""
        return dict(self._by_name)

    @classmethod
    def from_op_outputs(cls, outputs: Sequence[torch.Tensor], formats: tuple[str, ...]) -> TensorStats:
        """The statistics of the op's outputs (views: each output is split in a number of ops that does not
        depend on F, not one index op per column: the fallback counts its ops)."""
        f = len(formats)
        values: dict[str, torch.Tensor] = {}
        for output, tensor in zip(OUTPUTS, outputs, strict=True):
            if len(output.statistics) == 1:
                values[output.statistics[0].name] = tensor
                continue
            runs = list(output.runs())
            widths = [len(run) if run[0].per == PER_TENSOR else run[0].columns(f) for run in runs]
            for run, piece in zip(runs, tensor.split(widths, 1), strict=True):
                if run[0].per == PER_TENSOR:
                    values.update(zip((s.name for s in run), piece.unbind(1), strict=True))
                else:
                    values[run[0].name] = piece
        return cls(formats, **values)

    def outputs(self) -> tuple[torch.Tensor, ...]:
        """The op's outputs (statistics.OUTPUTS, in order) holding these statistics."""
        made = []
        for output in OUTPUTS:
            if len(output.statistics) == 1:
                made.append(self._by_name[output.statistics[0].name])
                continue
            pieces = [
                torch.stack([self._by_name[s.name] for s in run], 1)
                if run[0].per == PER_TENSOR
                else self._by_name[run[0].name]
                for run in output.runs()
            ]
            made.append(torch.cat(pieces, 1))
        return tuple(made)

    def merge(self, other: TensorStats) -> TensorStats:
        """The statistics of the union of the elements behind ``self`` and ``other``, row by row (the same T
        tensors' disjoint pieces, e.g. two micro-batches or two steps), each statistic by its merge. On the
        device, no host sync; derived values (norm) follow from the merged statistics."""
        if other.formats != self.formats or len(other) != len(self):
            raise ValueError(
                f"cannot merge statistics of {len(self)} tensors and formats {self.formats} with {len(other)} "
                f"tensors and formats {other.formats}"
            )
        merged = {s.name: getattr(torch, s.ufunc)(self._by_name[s.name], other._by_name[s.name]) for s in STATISTICS}
        return TensorStats(self.formats, **merged)

    def __len__(self) -> int:
        return self.numel.shape[0]

    def column(self, fmt: str) -> int:
        """The column of ``overflow``/``subnormal``/``underflow`` that holds format ``fmt``."""
        try:
            return self.formats.index(fmt)
        except ValueError:
            raise KeyError(f"format {fmt!r} was not requested; these were: {', '.join(self.formats)}") from None


def _rebuild(formats: tuple[str, ...], values: dict[str, torch.Tensor]) -> TensorStats:
    return TensorStats(formats, **values)


def _shape_words(s: Statistic) -> str:
    return {PER_TENSOR: "[T]", PER_FORMAT: "[T, F]", PER_BIN: f"[T, {HIST_BINS}]"}[s.per]


TensorStats.__doc__ = (
    (TensorStats.__doc__ or "")
    + "\n\n"
    + "\n".join(
        [f"    - ``{s.name}`` ({s.dtype} {_shape_words(s)}, merged by {s.merge}): {s.doc}." for s in STATISTICS]
        + [f"    - ``{d.name}`` (from {', '.join(d.needs)}): {d.doc}." for d in DERIVED if not d.in_module_record]
    )
)


def stats_outputs(stats: TensorStats) -> tuple[torch.Tensor, ...]:
    """The op's outputs of a TensorStats (``stats.outputs()``)."""
    return stats.outputs()


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
        refuse_nested("tensor_stats", f"tensor {i}", t)
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
