"""Random bit patterns in every input dtype, sizes at the kernels' chunk edges, many tensors, odd layouts:
the op against the pure-torch reference (exactly; sumsq to 1e-6) and against the independent oracles."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import amp_inspect
from amp_inspect.core.references.tensor_stats import tensor_stats_reference
from tests import oracles
from tests.oracles import ALL_FORMATS

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
SCALES = (None, 1.0, 2.0**16, 3.0, "tensor")
# CPU: chunks of 65536 in blocks of 2048 with 8 or 16 lanes; CUDA: chunks of 16384 with 16-byte vector loads.
EDGE_SIZES = (0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 2047, 2048, 2049, 16383, 16384, 16385, 65535, 65536, 65537)

NAN_PAYLOADS32 = [0x7FC00000, 0x7FC00001, 0x7FFFFFFF, 0x7F800001, 0x7FBFFFFF, 0x7FA00000]  # quiet, signalling
SPECIAL32 = [0x7F800000, 0x00000000, 0x00000001, 0x007FFFFF, 0x00400000, 0x7F7FFFFF, 0x00800000]


# ---------------------------------------------------------------------------------------------------------
# generators


def random_bits32(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 bit patterns: every exponent field (0..255) equally likely, so every binade, float32
    subnormals, Inf and NaN payloads appear; specials sprinkled in with both signs."""
    sign = rng.integers(0, 2, n, dtype=np.uint32) << np.uint32(31)
    exponent = rng.integers(0, 256, n, dtype=np.uint32) << np.uint32(23)
    mantissa = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    bits = sign | exponent | mantissa
    specials = np.array(NAN_PAYLOADS32 + SPECIAL32, dtype=np.uint32)
    specials = np.concatenate([specials, specials | np.uint32(0x80000000)])
    if n:
        k = min(n, max(1, n // 50))
        bits[rng.integers(0, n, k)] = rng.choice(specials, k)
    return bits


def random_tensor(rng: np.random.Generator, n: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.float32:
        return torch.from_numpy(random_bits32(rng, n).view(np.int32)).view(torch.float32)
    if dtype in (torch.float16, torch.bfloat16):
        return torch.from_numpy(rng.integers(0, 1 << 16, n, dtype=np.uint16).view(np.int16)).view(dtype)
    if dtype == torch.float64:
        return torch.from_numpy(random_bits64(rng, n).view(np.int64)).view(torch.float64)
    raise TypeError(dtype)


def strided_layouts(rng: np.random.Generator, *, big: bool) -> list[torch.Tensor]:
    """Random-bit views of every layout the kernels walk differently: transposed, step-sliced, permuted,
    stride 0 (expanded), more than 8 strided dims (copied first), 8 dims, column slices, empty and 0-dim.
    ``big`` (for a GPU) makes the views about ten times larger, so they cross more work chunks."""

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return random_tensor(rng, int(np.prod(shape)), dtype).reshape(shape)

    k = 10 if big else 1
    return [
        r(30 * k, 27).t(),
        r(500 * k)[::3],
        r(400 * k, dtype=torch.bfloat16)[1::7],
        r(3, 4 * k, 5 * k, 7, dtype=torch.float64).permute(2, 0, 3, 1),
        r(6, 13 + 20 * big, 10 * k, 9, dtype=torch.float16)[:, 1:30:2, ::3, 2:],
        r(1, 70).expand(9 * k, 70),  # stride 0
        r(*([3 + big] * 10), dtype=torch.float16)[(slice(None, None, 2),) * 10],  # > 8 strided dims: a copy
        torch.empty(0),
        r(70, 8 * k)[:, : 3 * k + 3],
        torch.tensor(3.0),
        r(2, 3, 4, 5, 6, 7, 2, 3).permute(7, 6, 5, 4, 3, 2, 1, 0),  # 8 dims
    ]


def random_bits64(rng: np.random.Generator, n: int) -> np.ndarray:
    """A third uniform 64-bit patterns (mostly far outside every format), a third with exponents around the
    formats' ranges (2^-160 .. 2^140, random 52-bit mantissas), a third float32 values widened."""
    raw = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
    sign = rng.integers(0, 2, n, dtype=np.uint64) << np.uint64(63)
    exponent = rng.integers(1023 - 160, 1023 + 140, n, dtype=np.uint64) << np.uint64(52)
    mantissa = rng.integers(0, 1 << 52, n, dtype=np.uint64)
    near = sign | exponent | mantissa
    with np.errstate(invalid="ignore"):  # signalling NaNs become quiet: fine, they stay NaN
        widened = oracles.f32_from_bits(random_bits32(rng, n)).astype(np.float64).view(np.uint64)
    pick = rng.integers(0, 3, n)
    bits = np.where(pick == 0, raw, np.where(pick == 1, near, widened))
    specials = np.array(
        [0x7FF0000000000001, 0x7FF8000000000000, 0x7FFFFFFFFFFFFFFF, 0x7FF0000000000000, 0, 1], dtype=np.uint64
    )
    if n:
        k = min(n, max(1, n // 50))
        chosen = rng.choice(specials, k) | (rng.integers(0, 2, k, dtype=np.uint64) << np.uint64(63))
        bits[rng.integers(0, n, k)] = chosen
    return bits


def scale_args(scale):
    """(what tensor_stats takes, the op's (scale tensor, scale_value), the float value for the oracles)."""
    if scale is None:
        return None, (None, None), None
    if scale == "tensor":
        t = torch.tensor(2.0**-16, dtype=torch.float32)  # 0-dim
        return t, (t, None), 2.0**-16
    return scale, (None, float(scale)), float(scale)


def check_all(tensors, scale=None, formats=ALL_FORMATS, *, exact=None) -> amp_inspect.core.TensorStats:
    """The op equals the reference; the public result matches the oracles; hist rows sum to numel; the
    caller's tensors are bitwise unchanged."""
    before = [(t.clone(), t.stride(), t.storage_offset(), t.data_ptr()) for t in tensors]
    public_scale, (scale_t, scale_v), scale_f = scale_args(scale)
    raw = torch.ops.amp_inspect.tensor_stats(tensors, scale_t, scale_v, list(formats))
    ref = tensor_stats_reference(tensors, scale_t, scale_v, list(formats))
    oracles.assert_outputs_equal(raw, ref, what=f"op vs reference (scale {scale}): ")
    stats = amp_inspect.tensor_stats(tensors, scale=public_scale, formats=formats)
    oracles.assert_outputs_equal(
        (
            torch.cat(
                [
                    stats.numel[:, None],
                    stats.nan[:, None],
                    stats.posinf[:, None],
                    stats.neginf[:, None],
                    stats.zero[:, None],
                    stats.overflow,
                    stats.subnormal,
                    stats.underflow,
                ],
                dim=1,
            ),
            stats.hist,
            stats.amax,
            stats.amin_nonzero,
            stats.sumsq,
        ),
        raw,
        what="public vs op: ",
    )
    oracles.assert_stats_match_oracle(stats, tensors, scale_f, exact=exact)
    assert torch.equal(stats.hist.sum(dim=1), stats.numel)
    assert stats.numel.tolist() == [t.numel() for t in tensors]
    for (copy, stride, offset, ptr), t in zip(before, tensors, strict=True):
        assert oracles.bits_equal(copy, t), "the op modified a caller's tensor"
        assert (t.stride(), t.storage_offset(), t.data_ptr()) == (stride, offset, ptr)
    return stats


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("scale", SCALES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_bits_chunk_edge_sizes(dtype, scale, seed):
    rng = np.random.default_rng(seed)
    tensors = [random_tensor(rng, n, dtype) for n in EDGE_SIZES]
    check_all(tensors, scale, exact=False)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_bits_small_exact_oracle(dtype, rng):
    """Small tensors also checked by the exact pure-Python classifier (for every dtype and format)."""
    tensors = [random_tensor(rng, n, dtype) for n in (1, 9, 100, 2049)]
    check_all(tensors, None, exact=True)
    check_all(tensors, 3.0, exact=True)


@pytest.mark.parametrize("formats", [("fp16",), ("bf16", "fp16"), ("fp8_e5m2", "fp8_e4m3", "bf16")], ids=str)
def test_format_subsets_and_orders(formats, rng):
    tensors = [random_tensor(rng, n, d) for n, d in zip((5000, 2049, 300, 17), DTYPES, strict=True)]
    stats = check_all(tensors, None, formats)
    full = amp_inspect.tensor_stats(tensors, formats=ALL_FORMATS)
    for k, f in enumerate(formats):
        for c in oracles.CATEGORIES:
            assert torch.equal(getattr(stats, c)[:, k], getattr(full, c)[:, full.column(f)])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 8, 9, 2048, 2049, 16385, 65536, 65537, 3 * 65536 + 5])
def test_nonfinite_at_first_middle_last(dtype, n, rng):
    """NaN / +Inf / -Inf at the first, middle and last positions of finite data, across chunk edges."""
    base = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(dtype)
    tensors = []
    for special in (float("nan"), float("inf"), float("-inf")):
        for pos in sorted({0, n // 2, n - 1, min(n - 1, 65535), min(n - 1, 2047)}):
            t = base.clone()
            t[pos] = special
            tensors.append(t)
    stats = check_all(tensors, None, exact=False)
    nonfinite = stats.nan + stats.posinf + stats.neginf
    assert nonfinite.tolist() == [1] * len(tensors)
    assert torch.equal(stats.hist[:, 255], nonfinite)


def test_more_than_1000_tensors(rng):
    """1500 small tensors of random sizes (some empty) and mixed dtypes in one call."""
    sizes = rng.integers(0, 300, 1500)
    sizes[rng.integers(0, 1500, 30)] = 0
    tensors = [random_tensor(rng, int(n), DTYPES[i % 4]) for i, n in enumerate(sizes)]
    stats = check_all(tensors, None, exact=False)
    assert len(stats) == 1500
    check_all(tensors, 3.0, exact=False)


def test_noncontiguous_layouts(rng):
    def r(*shape, dtype=torch.float32):
        shape = shape[0] if shape and isinstance(shape[0], tuple) else shape
        return random_tensor(rng, int(np.prod(shape)), dtype).reshape(shape)

    ten_d = r(*([4] * 10), dtype=torch.float16)[(slice(None, None, 2),) * 10]  # 10 strided dims: copied
    assert not ten_d.is_contiguous() and ten_d.dim() == 10
    tensors = [
        r(300, 257).t(),  # transposed: dense, read as its storage span
        r(5000)[::3],  # step slice
        r(4000, dtype=torch.bfloat16)[1::7],  # step slice at an offset
        r(3, 40, 50, 7, dtype=torch.float64).permute(2, 0, 3, 1),  # permuted 4-D
        r(6, 33, 20, 9)[:, 1:30:2, ::3, 2:],  # strided 4-D at an offset
        r(1, 70).expand(500, 70),  # stride 0: every repeat counts
        r(16, 1, dtype=torch.float16).expand(16, 4100),
        r(()).expand(3, 5, 7),
        ten_d,
        r(70, 80)[:, :33],  # rows with gaps
        r(2, 3, 4, 5, 6, 7, 8, 9, 2, dtype=torch.bfloat16)[:, :, :, :, :, :, :, ::2, :],
    ]
    stats = check_all(tensors, None, exact=False)
    assert int(stats.numel[5]) == 500 * 70
    check_all(tensors, 2.0**16, exact=False)
    check_all(tensors, "tensor", exact=False)
    # statistics do not depend on layout: each equals that of a contiguous copy
    contiguous = amp_inspect.tensor_stats([t.contiguous() for t in tensors], formats=ALL_FORMATS)
    for field in ("numel", "nan", "zero", "overflow", "subnormal", "underflow", "amax", "amin_nonzero", "hist"):
        assert torch.equal(getattr(stats, field), getattr(contiguous, field)), field


def test_expand_counts_each_repeat():
    x = torch.tensor([float("nan"), 1e5, 1e-30, 0.0, 2.0]).expand(1000, 5)
    stats = amp_inspect.tensor_stats([x], formats=("fp16",))
    assert int(stats.numel[0]) == 5000
    assert int(stats.nan[0]) == 1000
    assert int(stats.zero[0]) == 1000
    assert int(stats.overflow[0, 0]) == 1000
    assert int(stats.underflow[0, 0]) == 1000
    assert float(stats.sumsq[0]) == pytest.approx(1000 * (1e10 + 4.0 + float(np.float32(1e-30)) ** 2), rel=2e-6)


def test_empty_and_zero_dim_tensors_mixed_in(rng):
    tensors = [
        torch.empty(0),
        random_tensor(rng, 100, torch.float32),
        torch.empty(0, 5, dtype=torch.float16),
        torch.tensor(float("nan")),  # 0-dim
        torch.empty(3, 0, dtype=torch.float64),
        torch.tensor(7e4, dtype=torch.float64),
        random_tensor(rng, 70000, torch.bfloat16),
        torch.tensor(-1e-8, dtype=torch.float16),
        torch.empty(0, dtype=torch.bfloat16),
    ]
    stats = check_all(tensors, None, exact=False)
    assert stats.numel.tolist() == [0, 100, 0, 1, 0, 1, 70000, 1, 0]
    for i in (0, 2, 4, 8):
        assert int(stats.hist[i].sum()) == 0
        assert float(stats.amax[i]) == 0.0
        assert float(stats.amin_nonzero[i]) == float("inf")
        assert float(stats.sumsq[i]) == 0.0
    assert int(stats.nan[3]) == 1 and int(stats.overflow[5, 0]) == 1
    check_all(tensors, 3.0, exact=False)


def test_only_empty_tensors_and_empty_list():
    stats = check_all([torch.empty(0), torch.empty(0, 3, dtype=torch.float64)], None)
    assert stats.numel.tolist() == [0, 0]
    empty = amp_inspect.tensor_stats([], formats=("fp16", "bf16"))
    assert len(empty) == 0
    assert tuple(empty.overflow.shape) == (0, 2) and tuple(empty.hist.shape) == (0, 256)


@pytest.mark.parametrize("scale", SCALES, ids=str)
def test_mixed_dtypes_one_call(scale, rng):
    tensors = [random_tensor(rng, int(n), DTYPES[i % 4]) for i, n in enumerate(rng.integers(1, 5000, 12))]
    check_all(tensors, scale, exact=False)


def test_float64_beyond_float32_range():
    """Finite float64 beyond float32's range: hist bin 255 (float32(v) is Inf), amax is float32(max) = Inf,
    overflow in every format; below float32's range: bin 0 and underflow everywhere."""
    x = torch.tensor([1e39, -1e300, 1e-46, -1e-300, 5e-324, 1.0], dtype=torch.float64)
    stats = check_all([x], None)
    assert stats.overflow[0].tolist() == [2, 2, 2, 2]
    assert stats.underflow[0].tolist() == [3, 3, 3, 3]
    assert int(stats.hist[0, 255]) == 2 and int(stats.hist[0, 0]) == 3 and int(stats.hist[0, 127]) == 1
    assert int(stats.nan[0] + stats.posinf[0] + stats.neginf[0]) == 0
