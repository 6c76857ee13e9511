"""The CUDA kernels' own source, run on the CPU (csrc/tensor_stats/tensor_stats_emu.cpp: every CUDA thread of a block a
host thread, real barriers, shuffles and atomics) against the CPU kernel: exactly, sumsq to the tolerance of
the CUDA-vs-CPU tests (2e-6). Chunks are made small and grids chosen so that small tensors cross many chunk,
block, vector and tensor-table boundaries. Marked ``cuda_emu``: no GPU needed; skipped, saying so, only where the
test-only library amp_inspect._C_emu is not built (an installed wheel; conftest.py).

What this cannot see (needs a GPU: bench/gpu_check.sh): the GPU memory model, code generation, registers,
speed, streams and CUDA graphs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests import cuda_cases, oracles
from tests.oracles import ALL_FORMATS
from tests.test_random_bits import DTYPES, random_tensor

pytestmark = pytest.mark.cuda_emu

INLINE_VIEWS = 16  # csrc/tensor_stats/tensor_stats.h kInlineViews: more tensors take a table, or several launches
SMALL_CHUNK = 64  # elements per chunk in most tests (the GPU uses 2048)


def emulated(tensors, scale=None, formats=ALL_FORMATS, *, chunk=SMALL_CHUNK, blocks=3, inline=False):
    scale_tensor = scale if isinstance(scale, torch.Tensor) else None
    scale_value = None if scale is None or scale_tensor is not None else float(scale)
    return torch.ops.amp_inspect._tensor_stats_emulated(
        tensors, scale_tensor, scale_value, list(formats), chunk, blocks, inline
    )


def on_cpu(tensors, scale=None, formats=ALL_FORMATS):
    scale_tensor = scale if isinstance(scale, torch.Tensor) else None
    scale_value = None if scale is None or scale_tensor is not None else float(scale)
    return torch.ops.amp_inspect.tensor_stats(tensors, scale_tensor, scale_value, list(formats))


def check(tensors, scale=None, formats=ALL_FORMATS, **launch):
    got = emulated(tensors, scale, formats, **launch)
    want = on_cpu(tensors, scale, formats)
    oracles.assert_outputs_equal(got, want, rtol=2e-6, what=f"emulated vs cpu ({launch}, scale {scale}): ")
    return got


@pytest.mark.parametrize(("case", "scale"), cuda_cases.RUNS, ids=cuda_cases.RUN_IDS)
def test_shared_case(case: cuda_cases.Case, scale, rng):
    """The case table tests/test_cuda.py runs on a GPU, its sizes on this run's small chunk edges, on grids of
    1 to 5 blocks."""
    tensors = case.tensors(rng, SMALL_CHUNK)
    got = check(tensors, cuda_cases.scale_of(scale), blocks=(3, 5, 2, 4, 1)[case.scales.index(scale)])
    if case.one_nonfinite_each:
        assert (got[0][:, 1] + got[0][:, 2] + got[0][:, 3]).tolist() == [1] * len(tensors)


@pytest.mark.parametrize("formats", [("fp16",), ("bf16", "fp8_e5m2"), ("fp8_e4m3", "fp16", "bf16"), ALL_FORMATS])
def test_each_format_count(formats, rng):
    tensors = [random_tensor(rng, n, DTYPES[i % 4]) for i, n in enumerate((100, 1000, 3))]
    check(tensors, None, formats)
    check(tensors, 2.0**10, formats)


@pytest.mark.parametrize("blocks", [1, 2, 5, 40])
def test_grid_smaller_and_larger_than_chunk_count(blocks, rng):
    tensors = [random_tensor(rng, n, DTYPES[i % 4]) for i, n in enumerate((700, 64, 1, 129))]
    check(tensors, None, blocks=blocks)


@pytest.mark.parametrize("chunk", [8, 16, 24, 2048])
def test_chunk_sizes(chunk, rng):
    tensors = [random_tensor(rng, n, DTYPES[i % 4]) for i, n in enumerate((300, 17, 64, 1))]
    check(tensors, None, chunk=chunk, blocks=3)


@pytest.mark.parametrize("inline", [False, True], ids=["device_table", "inline_launches"])
def test_more_tensors_than_fit_in_the_parameters(inline, rng):
    """40 tensors: a table in "device" memory, or (as under CUDA graph capture) one launch per 16 views."""
    sizes = rng.integers(0, 200, 40)
    tensors = [random_tensor(rng, int(n), DTYPES[i % 4]) for i, n in enumerate(sizes)]
    assert len(tensors) > INLINE_VIEWS
    check(tensors, None, inline=inline, blocks=3)
    check(tensors, torch.tensor(0.25), inline=inline, blocks=2)


def test_empty_tensors_mixed_in_and_all_empty(rng):
    tensors = [torch.empty(0), random_tensor(rng, 70, torch.float32), torch.empty(0, 3, dtype=torch.float16)]
    check(tensors)
    got = check([torch.empty(0), torch.empty(0, dtype=torch.bfloat16)])
    assert got[0][:, 0].tolist() == [0, 0]
    assert torch.isinf(got[3]).all()


def test_squares_near_float32_limits(rng):
    """Batches whose largest |v| lies outside [2^-50, 2^60) sum squares in float64: huge values (whose
    float32 squares overflow) and tiny ones (whose float32 squares vanish) still give the float64 sum."""
    huge = torch.from_numpy((rng.standard_normal(300) * 2.0**100).astype(np.float32))
    tiny = torch.from_numpy((rng.standard_normal(300) * 2.0**-70).astype(np.float32))
    mixed = torch.cat([huge[:50], tiny[:50], torch.randn(100)])
    tensors = [huge, tiny, mixed, huge.to(torch.float64), (tiny * 2.0**40).to(torch.bfloat16)]
    got = check(tensors, None)
    for t, sumsq in zip(tensors, got[4], strict=True):
        exact = float((t.double() ** 2).sum())
        assert float(sumsq) == pytest.approx(exact, rel=2e-6)


def test_float64_below_float32_range_has_min_zero():
    """A nonzero float64 whose float32 is 0: amin_nonzero is float32 of the exact minimum, 0 (as on CPU)."""
    t = torch.tensor([1e-300, 1.0, 0.0, -3e-310], dtype=torch.float64)
    got = check([t])
    assert float(got[3][0]) == 0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("inv_scale", [2.0**-16, 1 / 3.0, 4.0])
@pytest.mark.parametrize("inline", [False, True], ids=["device_table", "inline_launches"])
def test_unscale_matches_torch_bitwise(dtype, inv_scale, inline, rng):
    sizes = (1, 15, 16, 17, 70, 300, 1025)
    ours = [torch.from_numpy((rng.standard_normal(n) * 1e3).astype(np.float32)).to(dtype) for n in sizes]
    ours.append((torch.randn(30, 20) * 1e3).to(dtype).t())  # strided
    ours.append(torch.empty(0, dtype=dtype))
    base = torch.randn(40).to(dtype)
    ours.append(base[3:33])  # unaligned start, in place through a view
    if inline:
        ours += [torch.randn(5).to(dtype) for _ in range(INLINE_VIEWS)]
    ours[4][11] = float("nan")
    ours[5][0] = float("inf")
    ours[6][1024] = float("-inf")
    theirs = [t.clone() for t in ours]
    before = [t.clone() for t in ours]
    inv = torch.tensor(inv_scale, dtype=torch.float32)
    found_ours, found_theirs = torch.zeros(()), torch.zeros(())

    got = torch.ops.amp_inspect._unscale_stats_emulated_(ours, inv, found_ours, ["fp16", "bf16"], 64, 3, inline)
    torch._amp_foreach_non_finite_check_and_unscale_(theirs, found_theirs, inv)

    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        nan = a.isnan()
        assert torch.equal(nan, b.isnan()), f"tensor {i} ({dtype}): NaN positions differ"
        assert oracles.bits_equal(a[~nan], b[~nan]), f"tensor {i} ({dtype}) differs from torch's unscale"
    assert float(found_ours) == float(found_theirs) == 1.0
    oracles.assert_outputs_equal(got, on_cpu(before, None, ["fp16", "bf16"]), what="unscale stats: ")


def test_unscale_leaves_found_inf_alone_when_finite(rng):
    ours = [torch.randn(300), torch.randn(70).half()]
    found = torch.zeros(())
    torch.ops.amp_inspect._unscale_stats_emulated_(ours, torch.tensor(0.5), found, ["fp16"], 64, 2, False)
    assert float(found) == 0.0


def test_bad_emulation_arguments_are_refused():
    with pytest.raises(RuntimeError, match="chunk_elems must be a positive multiple of 8"):
        emulated([torch.randn(10)], chunk=12)


# ---- the per-batch decisions of the full-batch loop (csrc/tensor_stats/tensor_stats_kernels.cuh, count_batch) ----

THREADS = 256  # kernels::kThreads
FORMAT_DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def _as_f32(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.asarray(bits, dtype=np.uint32).view(np.float32).copy())


def _first_bits(holds) -> int:
    """The smallest float32 |bits| in [0, 0x7F800000] for which holds(value) is true (holds is monotone)."""
    lo, hi = 0, 0x7F800000
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(_as_f32([mid])):
            hi = mid
        else:
            lo = mid + 1
    return lo


def cast_thresholds(fmt: str) -> list[int]:
    """The float32 |bits| each count of `fmt` tests against, found from torch's own casts (not the kernel's
    table): where the cast stops being finite, where it reaches the normal range, where it stops being zero."""
    dtype = FORMAT_DTYPES[fmt]
    tiny = torch.finfo(dtype).tiny
    return [
        _first_bits(lambda v: not bool(torch.isfinite(v.to(dtype).float()).all())),
        _first_bits(lambda v: float(v.to(dtype).float().abs()) >= tiny),
        _first_bits(lambda v: float(v.to(dtype).float()) != 0.0),
    ]


def _magnitudes(dtype: torch.dtype) -> np.ndarray:
    """Every finite nonnegative value of a 16-bit dtype as sorted float32 bits; float32: None (all bits are)."""
    bits = torch.arange(0, 0x8000, dtype=torch.int32).to(torch.int16).view(dtype).float()
    bits = bits[torch.isfinite(bits)]
    return np.unique(bits.numpy().view(np.uint32))


def _neighbours(t: int, dtype: torch.dtype) -> list[int]:
    """float32 bits of the input dtype's values just below, at or above, and just after threshold bits t."""
    if dtype == torch.float32:
        return [b for b in (t - 1, t, t + 1) if 0 <= b < 0x7F800000]
    values = _magnitudes(dtype)
    i = int(np.searchsorted(values, t))
    return [int(values[k]) for k in (i - 1, i, i + 1) if 0 <= k < len(values)]


def _nearest(bits: float, dtype: torch.dtype) -> float:
    return float(torch.tensor(bits, dtype=torch.float64).to(dtype).float())


def batch_cases(dtype: torch.dtype) -> list[tuple[float, float]]:
    """(value on or beside a bound, the value every other element of its batch takes: far below, far above,
    or the same, for a batch that lies wholly on the bound)."""
    cases = []
    thresholds = sorted({1, *(t for fmt in ALL_FORMATS for t in cast_thresholds(fmt))})
    finite_max = torch.finfo(dtype).max
    for t in thresholds:
        for bits in _neighbours(t, dtype):
            value = float(_as_f32([bits])[0])
            low = _nearest(value * 2.0**-12, dtype) if value > 0 else 0.0
            high = _nearest(min(max(value, 2.0**-100) * 2.0**12, finite_max), dtype)
            cases += [(value, low), (value, high), (value, value)]
    return cases


def batch_layout(dtype: torch.dtype) -> tuple[int, int, int]:
    """(elements per 16-byte vector, vectors per counted batch, vectors per load round), as count_dense."""
    per_vector = 16 // torch.tensor([], dtype=dtype).element_size()
    return per_vector, 4 if per_vector == 4 else 2, 4


def batches_with_one_value_on_a_bound(dtype: torch.dtype, rng: np.random.Generator) -> torch.Tensor:
    """A tensor of whole load rounds in which each thread's batch holds one value on or beside a bound, at
    every one of the 16 positions in turn, its other 15 elements far to one side; each case twice, on an
    even and an odd lane (the emulated vote answers the lane's own batch on even lanes, true on odd ones, so
    both the per-batch and the per-element way of counting see every case)."""
    per_vector, part, loads = batch_layout(dtype)
    batch = part * per_vector
    cases = [(value, far, pos) for value, far in batch_cases(dtype) for pos in range(batch)]
    round_elems = loads * THREADS * per_vector
    batches_per_round = THREADS * (loads // part)
    rounds = -(-2 * len(cases) // batches_per_round)
    values = np.zeros(rounds * round_elems, dtype=np.float32)
    slots = [(r, b, thread) for r in range(rounds) for b in range(loads // part) for thread in range(THREADS)]
    for i, (value, far, pos) in enumerate(cases):
        for r, b, thread in slots[2 * i : 2 * i + 2]:
            for k in range(batch):
                vector = thread + (b * part + k // per_vector) * THREADS
                values[r * round_elems + vector * per_vector + k % per_vector] = value if k == pos else far
    signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), values.size)
    return torch.from_numpy(values * signs).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES[:3], ids=str)
def test_one_value_on_each_bound_at_every_batch_position(dtype, rng):
    """The full-batch loop decides each threshold, the zeros and the extremes once per batch where the batch
    lies on one side: a batch with one element on (or just beside) a bound and the rest far away must be
    counted element by element, wherever in the batch that element sits."""
    t = batches_with_one_value_on_a_bound(dtype, rng)
    got = check([t], None, chunk=t.numel(), blocks=1)
    assert int(got[0][0, 0]) == t.numel()
    check([t], 2.0**-3, chunk=t.numel(), blocks=1)


@pytest.mark.parametrize("rows", [1, 16, 17], ids=lambda n: f"{n}rows")
def test_finalize_in_the_last_block_or_its_own_kernel(rows, rng):
    """Up to 16 rows (kFinalizeInBlockRows) the last stats block to finish writes the outputs, over all the
    call's launches (one per dtype here, some blocks without chunks); from 17 a finalize kernel does."""
    tensors = [random_tensor(rng, 50 + 37 * i, DTYPES[i % 4]) for i in range(rows)]
    check(tensors, None, blocks=7)
    check(tensors, 2.0**-4, blocks=1, inline=True)
