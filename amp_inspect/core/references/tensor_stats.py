"""Pure-torch implementation of the tensor_stats op: same arguments, same outputs, no host sync.

It runs wherever the compiled kernels cannot (a GPU the binary has no CUDA kernels for, MPS, XPU, ROCm, a
missing extension), and it is an oracle in the tests and a baseline in the benchmark. Definitions of every
statistic are in amp_inspect/core/tensor_stats.py and amp_inspect/core/formats.py.

How it stays cheap on a device, whatever the number of tensors:

- Tensors are grouped by dtype and copied, one ``torch._chunk_cat`` per group and chunk, into flat buffers
  of at most ``CHUNK_ELEMENTS`` elements (a tensor larger than the room left is split, a view per piece).
  fp16, bf16, fp32, and fp64 with a scale are judged as float32 values ("narrow"); fp64 without a scale on
  its own float64 bits ("wide").
- Each element gets the row of its tensor (``repeat_interleave`` with the output size known on the host)
  and a class: the number of format thresholds at or below its bit pattern, sign included, from one
  ``bucketize`` of the raw bits against thresholds sorted as signed integers. Class counts and the exponent
  histogram are two ``index_add_`` of ones into (row, class) and (row, bin) cells; each count column of the
  op is a sum of adjacent classes, read from prefix sums over the classes.
- amax and amin_nonzero are ``index_reduce_`` over the bit patterns of |v| (integer order is float order
  for non-negative floats); sumsq is an ``index_add_`` of float64 squares.

Cost per call: about 25 torch ops per chunk plus about 20 (so ~45 for up to 2^24 elements in one dtype),
whatever the number of tensors; no ``.item()``, no op whose output size depends on the data, and every
host-to-device copy from pinned memory, non-blocking. Memory: besides the outputs, temporaries of at most
~16 bytes per element of one chunk (measured peak on the CPU: 270 MB at 2^24), freed before the next. CUDA's
``index_add_`` uses atomics: counts are exact in any order, sumsq may differ in its last float64 bits.
"""

from __future__ import annotations

import struct
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from amp_inspect.core.formats import FORMAT_BOUNDS, HIST_BINS
from amp_inspect.core.statistics import BY_NAME, OUTPUT_NAMES, OUTPUTS, PER_FORMAT, new_outputs
from amp_inspect.core.torch_compat import chunk_cat

# The largest flat buffer one group of the fallback works on at a time: big enough that a GPT-2-sized set
# of gradients is one chunk (a chunk costs ~25 ops), small enough to bound the temporaries (~16 B/element).
CHUNK_ELEMENTS = 1 << 24
_PLAN_CACHE_SIZE = 8  # layouts kept uploaded: a training loop asks for the same list of tensors every step

# The output whose columns are the class counts below (numel ... underflow), in the schema's order.
COUNT_OUTPUT = OUTPUTS[OUTPUT_NAMES.index(BY_NAME["numel"].output)]

_F32_EXPONENT_SHIFT = 23
_F32_EXPONENT_MASK = 0xFF


def round_to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (ties to even), as a Python float."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


@dataclass(frozen=True)
class _Space:
    """The integers one kind of value is judged on: float32 bits ("narrow") or float64 bits ("wide")."""

    wide: bool
    int_dtype: torch.dtype
    float_dtype: torch.dtype
    abs_mask: int
    inf: int
    sign: int  # the integer whose bits are the sign bit alone (the most negative integer)

    def thresholds(self, formats: tuple[str, ...]) -> list[tuple[int, int, int]]:
        """(overflow_from, normal_from, zero_upto) per format, as bit patterns of |v| in this space."""
        bounds = (FORMAT_BOUNDS[name] for name in formats)
        if self.wide:
            return [(b.overflow_from64, b.normal_from64, b.zero_upto64) for b in bounds]
        return [(b.overflow_from, b.normal_from, b.zero_upto) for b in bounds]


NARROW = _Space(False, torch.int32, torch.float32, 0x7FFFFFFF, 0x7F800000, -(1 << 31))
WIDE = _Space(True, torch.int64, torch.float64, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000, -(1 << 63))


@dataclass(frozen=True)
class _Classes:
    """The classes elements are counted in, for one space and list of formats.

    ``magnitude_bounds`` are the thresholds on |bits| in ascending order (duplicates allowed): a magnitude's
    class k is how many of them are at or below it. As signed integers, a negative value's bits are its
    magnitude plus ``sign``, so one sorted list (the bounds shifted by ``sign``, then 0, then the bounds)
    classifies the raw bits: class k for a negative value, m + 1 + k for a positive one (m bounds).
    ``columns[c]`` are four indices into the exclusive prefix sum over classes, (hi, lo, hi, lo), whose
    differences add up to count column c of the op (positive range, negative range)."""

    magnitude_bounds: tuple[int, ...]
    columns: tuple[tuple[int, int, int, int], ...]

    @property
    def count(self) -> int:
        return 2 * (len(self.magnitude_bounds) + 1)

    def signed_bounds(self, space: _Space) -> list[int]:
        return [b + space.sign for b in self.magnitude_bounds] + [0, *self.magnitude_bounds]


def _classes(space: _Space, formats: tuple[str, ...]) -> _Classes:
    per_format = space.thresholds(formats)
    bounds = sorted({1, space.inf, space.inf + 1} | {x for of, nf, zu in per_format for x in (of, nf, zu + 1)})
    m = len(bounds)
    position = {b: i + 1 for i, b in enumerate(bounds)}  # index in the extended list 0, b_1..b_m, infinity
    position[0] = 0
    end = m + 1  # "infinity"

    def both(lo: int, hi_index: int) -> tuple[int, int, int, int]:
        """Magnitudes in [lo, hi) of either sign: classes lo..hi-1 offset by m + 1 (positive) and 0 (negative)."""
        return (m + 1 + hi_index, m + 1 + position[lo], hi_index, position[lo])

    # Each count statistic of the schema as class ranges: one entry per tensor, or a list per format.
    ranges: dict[str, Any] = {
        "numel": both(0, end),
        "nan": both(space.inf + 1, end),
        "posinf": (m + 1 + position[space.inf + 1], m + 1 + position[space.inf], 0, 0),
        "neginf": (position[space.inf + 1], position[space.inf], 0, 0),
        "zero": both(0, position[1]),
        "overflow": [both(of, position[space.inf]) for of, _, _ in per_format],  # finite, cast to Inf
        "subnormal": [both(zu + 1, position[nf]) for _, nf, zu in per_format],
        "underflow": [both(1, position[zu + 1]) for _, _, zu in per_format],  # nonzero, cast to zero
    }
    columns: list[tuple[int, int, int, int]] = []
    for statistic in COUNT_OUTPUT.statistics:  # in the op's column order
        columns += ranges[statistic.name] if statistic.per == PER_FORMAT else [ranges[statistic.name]]
    return _Classes(tuple(bounds), tuple(columns))


# ---------------------------------------------------------------------------------------------- device copies


def _upload(values: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list as a tensor on ``device`` without waiting for the device: a copy from pageable memory
    with non_blocking=False synchronises the stream on CUDA, a non-blocking copy from pinned memory does not."""
    host = torch.tensor(values, dtype=dtype)
    if device.type == "cpu":
        return host
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


_constants: dict[tuple, tuple[torch.Tensor, ...]] = {}
_plans: OrderedDict[tuple, list[tuple[torch.Tensor, ...]]] = OrderedDict()


def clear_device_copies() -> None:
    """Forgets the constants and layouts uploaded so far (the next call uploads them again)."""
    _constants.clear()
    _plans.clear()


def _constants_for(space: _Space, formats: tuple[str, ...], device: torch.device):
    """(classes, signed bounds, prefix-sum indices, signs, a one) on ``device``, made once per process and
    uploaded together. (On CUDA the first call's copy runs on the current stream: a first call on another
    stream right after it would have to wait for that stream.)"""
    key = (space.wide, formats, device)
    if key not in _constants:
        classes = _classes(space, formats)
        bounds = classes.signed_bounds(space)
        index = [i for column in classes.columns for i in column]
        signs = [1, -1, 1, -1]
        table = _upload([*bounds, *index, *signs, 1], torch.int64, device)
        bound_values, index_values, sign_values, one = table.split([len(bounds), len(index), len(signs), 1])
        _constants[key] = (classes, bound_values.to(space.int_dtype), index_values, sign_values, one)
    return _constants[key]


# ---------------------------------------------------------------------------------------------- the layout


@dataclass
class _Chunk:
    """One flat buffer of one dtype: what is copied into it, in order, and the (row, length) runs it holds."""

    dtype: torch.dtype
    parts: list[torch.Tensor]
    runs: list[tuple[int, int]]
    numel: int = 0


def _piece(t: torch.Tensor, unit: int, start: int, stop: int) -> torch.Tensor:
    """Elements [start, stop) of t in row-major order, as a view: of the flat tensor when t is contiguous
    (unit 1), else of whole dim-0 rows of ``unit`` elements (``_chunk_cat`` flattens them)."""
    if unit == 1:
        return t.view(-1)[start:stop]
    return t[start // unit : stop // unit]


def _layout(tensors: list[torch.Tensor], chunk: int) -> list[_Chunk]:
    """The chunks of a call: per dtype, whole tensors and pieces of the ones cut at a chunk's edge, with
    the 0-dim tensors stacked into one (``_chunk_cat`` takes tensors of at least one dim). A non-contiguous
    tensor is cut between dim-0 rows; one row larger than a chunk gets a chunk of its own. Empty tensors
    are left out: their rows keep the neutral values (zero counts, amax 0, amin_nonzero +inf)."""
    chunks: list[_Chunk] = []
    by_dtype: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel():
            by_dtype.setdefault(t.dtype, []).append(i)
    for dtype, rows in by_dtype.items():
        scalars = [i for i in rows if tensors[i].dim() == 0]
        entries: list[tuple[torch.Tensor, list[int] | int]] = []
        if scalars:
            entries.append((torch.stack([tensors[i] for i in scalars]), scalars))
        entries += [(tensors[i], i) for i in rows if tensors[i].dim() > 0]
        current = _Chunk(dtype, [], [])
        for t, owner in entries:
            unit = 1 if t.is_contiguous() else t.numel() // t.shape[0]
            done, total = 0, t.numel()
            while done < total:
                take = min(total - done, max(chunk - current.numel, 0) // unit * unit)
                if take == 0 and current.numel:
                    chunks.append(current)
                    current = _Chunk(dtype, [], [])
                    continue
                take = take or unit  # a row larger than a whole chunk
                current.parts.append(t if take == total else _piece(t, unit, done, done + take))
                if isinstance(owner, list):  # the stacked 0-dim tensors: one element each
                    current.runs += [(row, 1) for row in owner[done : done + take]]
                else:
                    current.runs.append((owner, take))
                current.numel += take
                done += take
        if current.parts:
            chunks.append(current)
    return chunks


def _layout_key(tensors: list[torch.Tensor], judged_wide: bool, chunk: int) -> tuple:
    """Everything ``_layout``'s runs depend on: equal keys give equal runs."""
    shape = tuple(
        (t.dtype, t.numel(), t.dim() == 0, 1 if t.is_contiguous() or not t.numel() else t.numel() // t.shape[0])
        for t in tensors
    )
    return (tensors[0].device, judged_wide, chunk, shape)


def _runs_on_device(chunks: list[_Chunk], key: tuple, device: torch.device) -> list[tuple[torch.Tensor, ...]]:
    """(rows, lengths) of each chunk's runs as int32 tensors on ``device``; uploaded once per layout, in one
    copy."""
    if key in _plans:
        _plans.move_to_end(key)
        return _plans[key]
    values = [x for c in chunks for pair in zip(*c.runs, strict=True) for x in pair]
    parts = _upload(values, torch.int32, device).split([len(c.runs) for c in chunks for _ in (0, 1)])
    plan = list(zip(parts[0::2], parts[1::2], strict=True))
    _plans[key] = plan
    if len(_plans) > _PLAN_CACHE_SIZE:
        _plans.popitem(last=False)
    return plan


# ---------------------------------------------------------------------------------------------- the counting


@dataclass
class _Accumulators:
    """Per-row results of one space, filled chunk by chunk: class counts, and amax / amin_nonzero encoded
    as integers (amax: |bits| of finite values; amin: (|bits| - 1) ^ sign, so zero sorts last and NaN/Inf
    at or above the initial value, which decodes to +inf)."""

    classes: _Classes
    bounds: torch.Tensor
    index: torch.Tensor
    signs: torch.Tensor
    one: torch.Tensor
    counts: torch.Tensor
    amax: torch.Tensor
    amin: torch.Tensor


def _accumulators(space: _Space, formats: tuple[str, ...], rows: int, device: torch.device) -> _Accumulators:
    classes, bounds, index, signs, one = _constants_for(space, formats, device)
    return _Accumulators(
        classes,
        bounds,
        index,
        signs,
        one,
        torch.zeros(rows * classes.count, dtype=torch.int64, device=device),
        torch.zeros(rows, dtype=space.int_dtype, device=device),
        torch.full((rows,), (space.inf - 1) ^ space.sign, dtype=space.int_dtype, device=device),
    )


def _count_chunk(
    x: torch.Tensor, row: torch.Tensor, space: _Space, acc: _Accumulators, hist: torch.Tensor, sumsq: torch.Tensor
) -> None:
    """Adds the statistics of the values ``x`` (our own flat copy, float32 or float64; consumed) whose
    rows are ``row``."""
    if space.wide:
        absolute = x.view(space.int_dtype) & space.abs_mask
        squares = x.square().masked_fill_(absolute >= space.inf, 0.0)  # a finite float64 square may be Inf
    else:
        squares = x.double().square_().nan_to_num_(0.0, 0.0, 0.0)  # float32 squares are exact in float64
    sumsq.index_add_(0, row, squares)
    del squares
    bits = x.view(space.int_dtype)
    ones = acc.one.expand(x.numel())
    cell = torch.bucketize(bits, acc.bounds, right=True, out_int32=True).add_(row, alpha=acc.classes.count)
    acc.counts.index_add_(0, cell, ones)
    exponent_bits = x.float().view(torch.int32) if space.wide else bits
    cell = (exponent_bits >> _F32_EXPONENT_SHIFT).bitwise_and_(_F32_EXPONENT_MASK).add_(row, alpha=HIST_BINS)
    hist.index_add_(0, cell, ones)
    del cell, exponent_bits
    if not space.wide:
        absolute = bits.bitwise_and_(space.abs_mask)  # in place: the values are no longer needed
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="index_reduce", category=UserWarning)  # "in beta"
        acc.amax.index_reduce_(0, row, absolute.masked_fill(absolute >= space.inf, 0), "amax")
        acc.amin.index_reduce_(0, row, absolute.sub_(1).bitwise_xor_(space.sign), "amin")


def _finish(space: _Space, acc: _Accumulators, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(counts int64 [T, 5 + 3F], amax float32 [T], amin_nonzero float32 [T]) of one space."""
    classes = acc.classes
    prefix = F.pad(acc.counts.view(rows, classes.count).cumsum(1), (1, 0))
    counts = (prefix.index_select(1, acc.index).view(rows, -1, 4) * acc.signs).sum(-1)
    amax = acc.amax.view(space.float_dtype)
    amin = (acc.amin ^ space.sign).add_(1).view(space.float_dtype)
    if space.wide:  # a float64 extreme is rounded to float32
        amax, amin = amax.float(), amin.float()
    return counts, amax, amin


def tensor_stats_reference(
    tensors: list[torch.Tensor],
    scale: torch.Tensor | None,
    scale_value: float | None,
    formats: list[str],
    *,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same arguments and outputs as ``torch.ops.amp_inspect.tensor_stats`` (inputs already checked, on
    one device).

    Returns (counts int64 [T, 5 + 3F], hist int64 [T, 256], amax float32 [T], amin_nonzero float32 [T],
    sumsq float64 [T]) on the device of the first tensor (CPU when there is none). Never syncs the host;
    ``chunk_elements`` bounds the flat buffers (module docstring)."""
    names = tuple(formats)
    if not tensors:
        return new_outputs(0, names, torch.device("cpu"), filled=True)  # type: ignore[return-value]
    device = tensors[0].device
    judged_wide = scale is None and scale_value is None
    multiplier: torch.Tensor | float | None = None
    if scale is not None:
        multiplier = scale
        if scale.dim() or scale.dtype != torch.float32 or scale.device != device:
            multiplier = scale.reshape(()).to(device=device, dtype=torch.float32, non_blocking=True)
    elif scale_value is not None:
        multiplier = round_to_float32(scale_value)  # float32 * float32, rounded once: the kernel's multiply
    with torch.no_grad():  # not one detach() per tensor: the copies below must not join a graph
        return _stats(tensors, multiplier, judged_wide, names, chunk_elements)


def _stats(
    tensors: list[torch.Tensor],
    multiplier: torch.Tensor | float | None,
    judged_wide: bool,
    names: tuple[str, ...],
    chunk_elements: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    device = tensors[0].device
    rows = len(tensors)
    chunks = _layout(tensors, chunk_elements)
    runs = _runs_on_device(chunks, _layout_key(tensors, judged_wide, chunk_elements), device)

    hist = torch.zeros(rows * HIST_BINS, dtype=torch.int64, device=device)
    sumsq = torch.zeros(rows, dtype=torch.float64, device=device)
    spaces: dict[_Space, _Accumulators] = {}
    for chunk, (run_rows, run_lengths) in zip(chunks, runs, strict=True):
        space = WIDE if chunk.dtype == torch.float64 and judged_wide else NARROW
        if space not in spaces:
            spaces[space] = _accumulators(space, names, rows, device)
        x = chunk_cat(chunk.parts, 0, 1).view(-1)
        if x.dtype != space.float_dtype:
            x = x.to(space.float_dtype)
        if multiplier is not None:
            x.mul_(multiplier)
        row = torch.repeat_interleave(run_rows, run_lengths, output_size=chunk.numel)
        _count_chunk(x, row, space, spaces[space], hist, sumsq)
        del x, row
    if not spaces:  # every tensor empty
        spaces[NARROW] = _accumulators(NARROW, names, rows, device)
    finished = [_finish(space, acc, rows) for space, acc in spaces.items()]
    counts, amax, amin = finished[0]
    for more_counts, more_amax, more_amin in finished[1:]:  # rows of the other space hold neutral values
        counts, amax, amin = counts + more_counts, torch.maximum(amax, more_amax), torch.minimum(amin, more_amin)
    return counts, hist.view(rows, HIST_BINS), amax, amin, sumsq
