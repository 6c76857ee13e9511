"""The float64 reference of format readiness: the op's outputs computed from core/recipes.py's rules alone.

``format_readiness_reference(tensors, recipe_indices, tensor_amax=None)`` returns ``(counts, sums, amax)``
exactly as ``amp_inspect::format_readiness`` does (READINESS shapes below), on the tensors' device. It is the
oracle the CPU and CUDA kernels are tested against and the fallback where the op has no kernel. It reads no
kernel: every scale and element cast is written here from the rules in core/recipes.py's docstring, with float32
tensors where a rule says ``fl32(...)`` (one IEEE float32 operation, tensor by tensor, never a Python scalar:
torch may divide by a scalar as a multiplication by its reciprocal) and float64 where a rule says the
arithmetic is exact (a power-of-two scaling, a dequantized value, an error).

Outputs, for T tensors and R recipes (in the order asked):

- ``counts`` int64 [T, 3 + 4R]: ``numel``, ``nonzero`` (finite nonzero elements), ``nonfinite`` (NaN/Inf),
  then per recipe ``flushed``, ``saturated``, ``blocks``, ``scale_flushed``;
- ``sums`` float64 [T, 1 + R]: ``sq_signal`` (sum of x^2 over finite x), then ``sq_error`` per recipe (sum
  over finite x of (x - dequant(quant(x)))^2);
- ``amax`` float32 [T]: the tensor amax used: the given one, else the measured finite amax (0 where a
  tensor has no finite element).

Dequantized values are float64: ``q * 2^X`` and ``q * total`` are exact there; ``q / s`` (the fp32 scales) is
float64's correctly rounded quotient (the kernels may round differently: sq_error agrees to a tolerance, the
counts exactly, since q / s is 0 only where q is).

Cost: a few dozen torch ops per tensor and recipe (a Python loop over tensors and recipes, none over
elements); temporaries of about 120 bytes per element at the peak (measured on the CPU: 465 MB over a
4M-element tensor, all eight recipes); on an idle core about 0.25 s for 1M elements and every recipe. It calls
no ``.item()`` and sizes everything from the shapes, so it should not sync the host (not checked on a GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from amp_inspect.core.recipes import (
    E8M0_MAX_EXPONENT,
    E8M0_MIN_EXPONENT,
    ELEMENT_FORMATS,
    NVFP4_TENSOR_DIVISOR,
    RECIPES,
    ElementFormat,
    Recipe,
)

COUNTS_PER_TENSOR = ("numel", "nonzero", "nonfinite")
COUNTS_PER_RECIPE = ("flushed", "saturated", "blocks", "scale_flushed")
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FLT_MAX = torch.finfo(torch.float32).max

_F64_MANTISSA_BITS = 52
_F64_EXPONENT_BIAS = 1023
_F64_EXPONENT_MASK = 0x7FF
_E4M3 = ELEMENT_FORMATS["e4m3"]
_E2M1 = ELEMENT_FORMATS["e2m1"]
_E4M3_MIN_NORMAL = 2.0**_E4M3.emin


def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^exponent as float64, exactly, built from its bits (exponent an integer tensor in [-1022, 1023]).

    Not ``torch.ldexp``: it multiplies by ``torch.pow(2, e)`` in the default dtype (float32), which cannot
    hold the powers the e8m0 scales and the float64 exponents reach."""
    biased = exponent.to(torch.int64) + _F64_EXPONENT_BIAS
    return (biased << _F64_MANTISSA_BITS).view(torch.float64)


def floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2 a) as int64, exactly, for float64 a > 0 normal (every float32 is one, widened): its exponent
    field. a = 0 gives -1023 (callers clamp or mask it)."""
    bits = a.to(torch.float64).view(torch.int64)
    return ((bits >> _F64_MANTISSA_BITS) & _F64_EXPONENT_MASK) - _F64_EXPONENT_BIAS


def ceil_log2(a: torch.Tensor) -> torch.Tensor:
    """The least integer X with 2^X >= a, as int64, for float64 a > 0 normal (a = 0 gives -1022: mask it)."""
    e = floor_log2(a)
    return torch.where(pow2(e.clamp(min=-_F64_EXPONENT_BIAS + 1)) == a, e, e + 1)


def cast_element(v: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """cast_E(v): v (any float tensor, NaN-free) rounded to nearest, ties to even, on the grid of ``fmt``, its
    subnormals included, saturating: |v| > max gives max with v's sign (Inf too). Returned as float64.

    The grid: in the binade [2^e, 2^(e+1)) with e >= emin, the spacing is 2^(e - mbits); below 2^emin the
    subnormals keep the spacing of the lowest binade, 2^(emin - mbits). So v / spacing rounded half to even
    (``torch.round``), times the spacing, is the cast; both scalings are exact in float64 (the values here are
    float64 normals: float32 values scaled by at most 2^127 either way)."""
    v = v.to(torch.float64)
    a = v.abs()
    q = _round_on_unbounded_grid(a, fmt)
    q = torch.where(a > fmt.max_value, torch.full_like(q, fmt.max_value), q)
    return torch.copysign(q, v)


def _round_on_unbounded_grid(a: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """|v| (float64, >= 0) rounded to nearest, ties to even, on ``fmt``'s grid continued above its max (the
    binades go on with the same mantissa bits), so that values past the max round to where a cast without
    saturation would send them."""
    exponent = floor_log2(a).clamp(min=fmt.emin) - fmt.mbits
    # exponent <= 1024 - mbits for finite a; an infinite a rounds to a large finite value here (above any max)
    exponent = exponent.clamp(max=_F64_EXPONENT_BIAS - fmt.mbits)
    return torch.round(a * pow2(-exponent)) * pow2(exponent)


def clamped_by_cast(v: torch.Tensor, fmt: ElementFormat) -> torch.Tensor:
    """Whether cast_E clamps v (core/recipes.py: ``saturated``): its rounding on the grid continued past max_E is
    above max_E. A |v| in (max_E, max_E + half an ulp) rounds to max_E as any value rounds to its neighbour, and
    is not counted (E4M3's tie at 464 rounds to the even 448; E5M2's at 61440 and E2M1's at 7 round up)."""
    return _round_on_unbounded_grid(v.to(torch.float64).abs(), fmt) > fmt.max_value


def _f32(value: float, like: torch.Tensor) -> torch.Tensor:
    """A float32 tensor of ``value`` shaped like ``like``: operands of fl32(...) operations stay tensors."""
    return torch.full_like(like, value, dtype=torch.float32)


class _Quantized:
    """One recipe's outcome on a tensor's blocks ([N, B] elements, [N] blocks)."""

    def __init__(self, dequantized: torch.Tensor, scaled: torch.Tensor, scale_flushed: torch.Tensor) -> None:
        self.dequantized = dequantized  # float64 [N, B]
        self.scaled = scaled  # float64 [N, B]: v, the value the element cast sees (0 where there is none)
        self.scale_flushed = scale_flushed  # bool [N]


def _fp32_scaled(x: torch.Tensor, amax: torch.Tensor, fmt: ElementFormat) -> _Quantized:
    """fp32_tensor / fp32_block: s = fl32(max_E / amax) (1 where amax is 0, Inf or NaN; FLT_MAX where it overflows),
    v = fl32(x * s), q = cast_E(v), dequantized q / s."""
    s = _f32(fmt.max_value, amax) / amax
    # amax 0 (nothing to scale) or a given amax that is Inf or NaN: the unit scale, as TE's current scaling
    s = torch.where((amax == 0) | ~torch.isfinite(amax), _f32(1.0, amax), s)
    overflowed = torch.isinf(s)
    s = torch.where(overflowed, _f32(FLT_MAX, amax), s)
    v = x * s[:, None]
    q = cast_element(v, fmt)
    return _Quantized(q / s.to(torch.float64)[:, None], v.to(torch.float64), overflowed)


def _e8m0_scaled(x: torch.Tensor, amax: torch.Tensor, fmt: ElementFormat, round_up: bool) -> _Quantized:
    """e8m0_floor: X = floor(log2 amax_b) - emax_E; e8m0_rceil: X = ceil(log2 fl32(amax_b / max_E)). Clamped to
    E8M0's [-127, 127] (counted in scale_flushed where a block with amax_b > 0 needed more); -127 where the
    amax (or r) is 0. v = x * 2^-X exact, q = cast_E(v), dequantized q * 2^X."""
    if round_up:
        r = amax / _f32(fmt.max_value, amax)
        zero = r == 0
        wanted = ceil_log2(r.to(torch.float64))
    else:
        zero = amax == 0
        wanted = floor_log2(amax.to(torch.float64)) - fmt.emax
    clamped = wanted.clamp(E8M0_MIN_EXPONENT, E8M0_MAX_EXPONENT)
    # a block with amax_b > 0 whose r underflowed to 0 needed a scale below 2^-127: clamped as well
    scale_flushed = (amax > 0) & (zero | (clamped != wanted))
    exponent = torch.where(zero, torch.full_like(clamped, E8M0_MIN_EXPONENT), clamped)[:, None]
    v = x.to(torch.float64) * pow2(-exponent)
    q = cast_element(v, fmt)
    return _Quantized(q * pow2(exponent), v, scale_flushed)


def _nvfp4_scaled(x: torch.Tensor, amax_b: torch.Tensor, amax_t: torch.Tensor) -> _Quantized:
    """nvfp4: d = fl32(amax_t / 2688) (1 where amax_t is 0, Inf or NaN); s_b = cast_E4M3(fl32(fl32(amax_b / 6)
    / d)), not clamped up to E4M3's smallest normal; total = fl32(d * s_b). total = 0: the block dequantizes to
    0; else v = fl32(x / total), q = cast_E2M1(v), dequantized q * total. scale_flushed: amax_b > 0 and s_b zero
    or subnormal."""
    amax_t = amax_t.reshape(1).to(torch.float32)
    d = amax_t / _f32(NVFP4_TENSOR_DIVISOR, amax_t)
    # amax_t 0, Inf or NaN (a given, stale amax): d = 1, as TE's encode scale does; a tensor whose own amax is 0
    # holds only zeros, so d does not matter there
    d = torch.where((amax_t == 0) | ~torch.isfinite(amax_t), _f32(1.0, amax_t), d)
    per_element = amax_b / _f32(_E2M1.max_value, amax_b)
    # fl32(amax_b / 6) = 0 (a block of zeros, or of float32 subnormals below 3 * 2^-149) with d = 0 would be
    # 0/0: the scale is 0 there, as it is wherever d > 0
    wanted = torch.where(per_element == 0, torch.zeros_like(per_element), per_element / d)
    s_b = cast_element(wanted, _E4M3).to(torch.float32)  # E4M3 values are float32 values
    total = d * s_b
    nonzero_total = (total != 0)[:, None]
    safe_total = torch.where(total == 0, _f32(1.0, total), total)[:, None]
    v = torch.where(nonzero_total, x / safe_total, torch.zeros_like(x))
    q = cast_element(v, _E2M1)
    dequantized = torch.where(nonzero_total, q * total.to(torch.float64)[:, None], torch.zeros_like(q))
    scale_flushed = (amax_b > 0) & (s_b < _E4M3_MIN_NORMAL)
    return _Quantized(dequantized, v.to(torch.float64), scale_flushed)


def _blocks(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The finite-masked float32 elements as [N, B] blocks along the last dimension (a row's short last block
    padded with zeros, which no count or sum sees) and the mask of real finite elements, [N, B].

    block 0: the whole tensor is one block."""
    rows_by_last = x.reshape(1, -1) if block == 0 or x.dim() == 0 else x.reshape(-1, x.shape[-1])
    length = rows_by_last.shape[1]
    width = length if block == 0 else block
    padded_length = -(-length // width) * width
    finite = torch.isfinite(rows_by_last)
    values = torch.where(finite, rows_by_last, torch.zeros_like(rows_by_last))
    pad = padded_length - length
    values = torch.nn.functional.pad(values, (0, pad))
    finite = torch.nn.functional.pad(finite, (0, pad), value=False)
    return values.reshape(-1, width), finite.reshape(-1, width)


def _quantize(recipe: Recipe, x: torch.Tensor, amax_t: torch.Tensor) -> _Quantized:
    """The recipe's scale rule on [N, B] blocks of finite values (amax_t: the tensor amax the rule uses)."""
    fmt = recipe.element_format
    amax_b = x.abs().amax(dim=1)
    if recipe.scale == "fp32_tensor":
        return _fp32_scaled(x, amax_t.reshape(1).expand(x.shape[0]), fmt)
    if recipe.scale == "fp32_block":
        return _fp32_scaled(x, amax_b, fmt)
    if recipe.scale in ("e8m0_floor", "e8m0_rceil"):
        return _e8m0_scaled(x, amax_b, fmt, round_up=recipe.scale == "e8m0_rceil")
    if recipe.scale == "nvfp4":
        return _nvfp4_scaled(x, amax_b, amax_t)
    raise ValueError(f"recipe {recipe.name!r} has an unknown scale rule {recipe.scale!r}")


def _check(tensors: Sequence[torch.Tensor], recipe_indices: Sequence[int], tensor_amax: torch.Tensor | None) -> None:
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] is a {type(t).__name__}, not a tensor")
        if t.dtype not in INPUT_DTYPES:
            raise TypeError(f"tensors[{i}] is {t.dtype}; format readiness takes float32, bfloat16 or float16")
        if t.device != tensors[0].device:
            raise ValueError(f"tensors[{i}] is on {t.device} and tensors[0] on {tensors[0].device}; use one device")
    for r in recipe_indices:
        if not 0 <= int(r) < len(RECIPES):
            raise ValueError(f"recipe index {r} is out of range: there are {len(RECIPES)} recipes")
    if tensor_amax is not None:
        if tensor_amax.dtype != torch.float32 or tuple(tensor_amax.shape) != (len(tensors),):
            got = f"{tensor_amax.dtype} {list(tensor_amax.shape)}"
            raise ValueError(f"tensor_amax must be float32 of shape [{len(tensors)}], not {got}")
        if tensors and tensor_amax.device != tensors[0].device:
            raise ValueError(f"tensor_amax is on {tensor_amax.device} and the tensors on {tensors[0].device}")


def format_readiness_reference(
    tensors: Sequence[torch.Tensor], recipe_indices: Sequence[int], tensor_amax: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(counts, sums, amax) of ``tensors`` for the recipes ``RECIPES[i]`` for i in ``recipe_indices``, as the
    format_readiness op gives them (module docstring: what it costs)."""
    tensors = list(tensors)
    indices = [int(r) for r in recipe_indices]
    _check(tensors, indices, tensor_amax)
    device = tensors[0].device if tensors else torch.device("cpu")
    recipes = [RECIPES[i] for i in indices]
    counts = torch.zeros(
        len(tensors), len(COUNTS_PER_TENSOR) + len(COUNTS_PER_RECIPE) * len(recipes), dtype=torch.int64, device=device
    )
    sums = torch.zeros(len(tensors), 1 + len(recipes), dtype=torch.float64, device=device)
    amax = torch.zeros(len(tensors), dtype=torch.float32, device=device)
    for t, tensor in enumerate(tensors):
        x = tensor.detach().to(torch.float32)  # exact: bf16 and fp16 values are float32 values
        finite = torch.isfinite(x)
        finite_x = torch.where(finite, x, torch.zeros_like(x))
        measured = finite_x.abs().amax() if x.numel() else torch.zeros((), dtype=torch.float32, device=device)
        amax_t = measured if tensor_amax is None else tensor_amax[t]
        amax[t] = amax_t
        counts[t, 0] = x.numel()
        counts[t, 1] = (finite & (x != 0)).sum()
        counts[t, 2] = x.numel() - finite.sum()
        sums[t, 0] = finite_x.to(torch.float64).square().sum()
        if x.numel() == 0:
            continue  # no blocks, nothing to lose: the recipe columns stay 0
        blocked: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # recipes of one block size share the layout
        for r, recipe in enumerate(recipes):
            if recipe.block not in blocked:
                blocked[recipe.block] = _blocks(x, recipe.block)
            values, real = blocked[recipe.block]
            outcome = _quantize(recipe, values, amax_t.to(torch.float32))
            deq = outcome.dequantized
            column = len(COUNTS_PER_TENSOR) + len(COUNTS_PER_RECIPE) * r
            fmt = recipe.element_format
            counts[t, column + 0] = (real & (values != 0) & (deq == 0)).sum()
            counts[t, column + 1] = (real & clamped_by_cast(outcome.scaled, fmt)).sum()
            counts[t, column + 2] = values.shape[0]
            counts[t, column + 3] = outcome.scale_flushed.sum()
            error = torch.where(real, values.to(torch.float64) - deq, torch.zeros_like(deq))
            sums[t, 1 + r] = error.square().sum()
    return counts, sums, amax
