"""The CUDA kernels' own source, run on the CPU (csrc/tensor_stats_emu.cpp: every CUDA thread of a block a
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

INLINE_VIEWS = 16  # csrc/tensor_stats_launch.h kInlineViews: more tensors take a table, or several launches
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
