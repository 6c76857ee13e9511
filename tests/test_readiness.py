"""The format_readiness op's CPU kernel (csrc/readiness/readiness_cpu.cpp on csrc/readiness/readiness.h) against the
float64 reference (amp_inspect/core/references/format_readiness.py) and against torch's own float8 casts; the op as
torch sees it (opcheck), its input checks, and the Python face (amp_inspect.format_readiness, ReadinessStats).

Exactness: counts and amax equal the reference's exactly. sq_signal and sq_error are float64 sums of the same
float64 terms (both compute each element's x^2 and (x - dequant)^2 the same way, q / s as float64's correctly
rounded quotient), added in another order: a sum of n nonnegative terms in float64 is within (n - 1) * 2^-53 of
the exact sum relative to itself, so the two agree to a relative ``sums_rtol(n) = 2 * n * 2^-53``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import amp_inspect
from amp_inspect.core import ops as _ops
from amp_inspect.core.format_readiness import ReadinessStats
from amp_inspect.core.recipes import ELEMENT_FORMATS, RECIPE_NAMES, RECIPES
from amp_inspect.core.references.format_readiness import format_readiness_reference
from amp_inspect.core.statistics import READINESS
from tests.oracles import clamped_by_cast
from tests.test_random_bits import random_tensor
from tests.test_readiness_reference import grid_boundaries, nvfp4_tensor

needs_kernel = pytest.mark.skipif(
    "cpu" not in _ops.OP_KERNELS["format_readiness"], reason=f"no CPU kernel: {_ops.LOAD_ERROR}"
)
pytestmark = needs_kernel

OP = torch.ops.amp_inspect.format_readiness if _ops.extension_loaded() else None
ALL = list(range(len(RECIPES)))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
NAN, INF = float("nan"), float("inf")
# Row lengths around every block size (16, 32, 128) and the chunk size, so short last blocks of each kind appear.
ROW_LENGTHS = (1, 5, 15, 16, 17, 31, 32, 33, 100, 127, 128, 129, 160, 300)


def sums_rtol(numel: int) -> float:
    """The relative bound on two float64 sums of the same n nonnegative terms in different orders (module doc)."""
    return 2 * max(numel, 1) * 2.0**-53


def assert_matches_reference(tensors, recipes=ALL, tensor_amax=None) -> None:
    got = OP(tensors, recipes, tensor_amax)
    want = format_readiness_reference(tensors, recipes, tensor_amax)
    counts, sums, amax = got
    assert counts.dtype == torch.int64 and sums.dtype == torch.float64 and amax.dtype == torch.float32
    assert torch.equal(counts, want[0]), (counts - want[0]).nonzero().tolist()
    assert torch.equal(amax, want[2]) or torch.allclose(amax, want[2], equal_nan=True, rtol=0, atol=0)
    numel = max([t.numel() for t in tensors], default=1)
    assert torch.allclose(sums, want[1], rtol=sums_rtol(numel), atol=0), (sums, want[1])


# ---------------------------------------------------------------------------------------------------------
# edge cases


def edge_tensors() -> list[torch.Tensor]:
    """Every recipe at its edges: each element grid's values, ties, half its smallest subnormal, its max and just
    above (scale 1 for the fp8 tensor recipes by a 448 / 57344 in the tensor); blocks whose amax is a power of two;
    a block of zeros; blocks holding one NaN or Inf; NVFP4 blocks whose scale goes subnormal or flushes; float32
    subnormals; FLT_MAX."""
    out: list[torch.Tensor] = []
    for name, fmt in ELEMENT_FORMATS.items():
        values = torch.from_numpy(grid_boundaries(name))
        out.append(values)  # as one row: blocks of mixed magnitudes
        out.append(torch.cat([values, torch.tensor([fmt.max_value])]).reshape(-1, 1))  # one element per row
        pad = (-values.numel()) % 32
        out.append(torch.cat([values, torch.zeros(pad)]).reshape(-1, 32))
    for e in (-149, -133, -127, -126, -20, -9, 0, 8, 15, 100, 127):
        block = torch.full((32,), 2.0**e)
        block[1::2] *= -0.75
        out.append(block)
        out.append(block * 0.999)  # amax just below a power of two: the OCP floor scale saturates
    out.append(torch.zeros(3, 40))
    nan_block = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    nan_block[0, 3], nan_block[1, 40], nan_block[2, 0], nan_block[3, 63] = NAN, INF, -INF, NAN
    out.append(nan_block)
    out.append(torch.tensor([NAN, INF, -INF]))
    out.append(nvfp4_tensor([[6 * 2.0**-8, 2.0**-9], [6 * 1.3 * 2.0**-9], [6 * 2.0**-10, 2.0**-12, -(2.0**-11)]]))
    out.append(nvfp4_tensor([[3.0, 1.2, -0.7], [6.0, 0.5, -1.5, 3.0]]))
    out.append(torch.tensor([2.0**-140, 2.0**-141]))  # NVFP4's d = 0
    out.append(torch.tensor([2.0**-149, 0.0, -(2.0**-149)]))  # fl32(amax_b / 6) = 0
    out.append(torch.tensor([torch.finfo(torch.float32).max, -1.0, 1e-30]))
    out.append(torch.tensor([1e-40, -3e-39, 1.1754942e-38, 5e-45] * 8))  # float32 subnormals
    out.append(torch.tensor(3.5))  # 0-d
    out.append(torch.zeros(0))
    out.append(torch.zeros(2, 0, 5))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_edge_cases_equal_the_reference(dtype) -> None:
    tensors = [t.to(dtype) for t in edge_tensors()]
    assert_matches_reference(tensors)


@pytest.mark.parametrize("given", [0.0, -0.0, 1e-41, 2.0**-140, 0.5, 448.0, 3e38, INF, NAN], ids=lambda v: f"amax={v}")
def test_a_given_tensor_amax_equals_the_reference(given) -> None:
    tensors = edge_tensors()[::3] + [torch.randn(6, 70, generator=torch.Generator().manual_seed(2)) * 100]
    amax = torch.full((len(tensors),), given)
    assert_matches_reference(tensors, tensor_amax=amax)
    _, _, used = OP(tensors, ALL, amax)
    assert torch.equal(used.view(torch.int32), amax.view(torch.int32))  # the amax used is the one given


def test_each_recipe_alone_and_in_any_order_is_its_column() -> None:
    tensors = edge_tensors()
    together = OP(tensors, ALL, None)
    order = [7, 2, 5, 0, 3]
    some = OP(tensors, order, None)
    for k, r in enumerate(order):
        alone = OP(tensors, [r], None)
        assert torch.equal(alone[0][:, 3:], together[0][:, 3 + 4 * r : 7 + 4 * r])
        assert torch.equal(some[0][:, 3 + 4 * k : 7 + 4 * k], alone[0][:, 3:])
        assert torch.equal(alone[1][:, 1], together[1][:, 1 + r])
    assert torch.equal(OP(tensors, [], None)[0], together[0][:, :3])


# ---------------------------------------------------------------------------------------------------------
# random bit patterns


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_random_bit_patterns_equal_the_reference(dtype, seed) -> None:
    rng = np.random.default_rng(seed)
    tensors = []
    for length in ROW_LENGTHS:
        rows = int(rng.integers(1, 5))
        tensors.append(random_tensor(rng, rows * length, dtype).reshape(rows, length))
    tensors.append(random_tensor(rng, 3 * 4 * 45, dtype).reshape(3, 4, 45))
    assert_matches_reference(tensors)
    finite = [t.float().nan_to_num(0, 0, 0).abs().amax() if t.numel() else torch.tensor(0.0) for t in tensors]
    stale = torch.stack(finite) * torch.from_numpy(rng.uniform(0.25, 4, len(tensors))).float()
    assert_matches_reference(tensors, tensor_amax=stale)


def test_random_values_of_every_magnitude_equal_the_reference() -> None:
    """Random bits have random exponents; gradients and activations have blocks of similar magnitude: normal
    values scaled per row by powers of two from 2^-140 to 2^120, in rows crossing a chunk (64Ki elements)."""
    g = torch.Generator().manual_seed(3)
    scales = 2.0 ** torch.arange(-140, 121, 20, dtype=torch.float64)
    x = (torch.randn(len(scales), 700, generator=g, dtype=torch.float64) * scales[:, None]).float()
    big = torch.randn(70000, generator=g) * 3
    for dtype in DTYPES:
        assert_matches_reference([x.to(dtype), big.to(dtype)])


def test_non_contiguous_tensors_are_read_in_their_logical_order() -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randn(48, 40, generator=g) * torch.logspace(-6, 6, 40)
    views = [x.t(), x[:, ::3], x.t()[::2], x.expand(2, 48, 40), x[5]]
    for v in views:
        got = OP([v], ALL, None)
        same = OP([v.contiguous()], ALL, None)
        assert all(torch.equal(a, b) for a, b in zip(got, same, strict=True))
    assert_matches_reference(views)


def test_results_do_not_depend_on_the_number_of_threads() -> None:
    """Each chunk's totals have a slot of their own, summed in chunk order: the same bits on 1 thread or many."""
    g = torch.Generator().manual_seed(6)
    tensors = [torch.randn(5, 70000, generator=g), torch.randn(300000, generator=g).bfloat16()]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = OP(tensors, ALL, None)
        torch.set_num_threads(max(2, threads))
        many = OP(tensors, ALL, None)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(one, many, strict=True))


def nvfp4_zero_scale_units() -> list[torch.Tensor]:
    """128-element units mixing NVFP4 blocks whose total scale is 0 (all zeros, or an amax far below the tensor's:
    s_b rounds to 0) with ordinary blocks, and a NaN in one: the CPU kernel judges such blocks in its fast loop
    (readiness_cpu.cpp), which must give the exact path's verdicts."""
    g = torch.Generator().manual_seed(21)
    x = torch.randn(6, 256, generator=g)
    x[0, :3] = 2.0**24  # the tensor amax: s_b = 0 for blocks of ordinary values
    x[1, 16:48] = 0.0  # zero blocks beside ordinary ones
    x[2, ::16] *= 2.0**-30  # tiny amaxes in some blocks
    x[3, 5] = NAN
    x[4] *= 2.0**18  # blocks that keep a scale
    return [x, x[1:].clone()]  # the second without the outlier: ordinary scales, with its zero blocks


@pytest.mark.parametrize("dtype", DTYPES)
def test_nvfp4_blocks_whose_scale_is_zero_equal_the_reference(dtype) -> None:
    tensors = [t.to(dtype) for t in nvfp4_zero_scale_units()]
    assert_matches_reference(tensors)
    assert_matches_reference(tensors, [RECIPE_NAMES.index("nvfp4")])


def vector_edge_units() -> list[torch.Tensor]:
    """Units for the CPU kernel's vector loops (readiness_cpu.cpp, the AVX2 path on x86-64-v3): rows whose length
    leaves a partial last vector of 8 elements, both signs, and NVFP4 units whose eight block scales are taken
    together, mixing zero blocks, blocks whose E4M3 scale is subnormal or 0, and blocks where a step of nvfp4_scale
    is no normal float32 (an amax near 2^-126, whose amax / 6 is subnormal), which send the unit to the scalar rule."""
    g = torch.Generator().manual_seed(33)
    rows = torch.randn(12, 45, generator=g) * 2.0 ** torch.randint(-12, 12, (12, 1), generator=g).float()
    x = torch.randn(8, 141, generator=g)
    x[0, :2] = 2.0**20  # the tensor amax: small blocks' E4M3 scales go subnormal, then to 0
    x[1, 16:32] = 0.0
    x[2, 32:48] *= 2.0**-12
    x[3, 48:64] *= 2.0**-22
    x[4, 64:80] = torch.randn(16, generator=g) * 2.0**-125  # amax / 6 below float32's normal range
    x[5, ::2] = -x[5, ::2].abs()
    return [rows, x, x[1:].clone()]


def test_vector_loops_partial_vectors_and_nvfp4_block_scales_equal_the_reference() -> None:
    """(Flush-to-zero on: test_flush_to_zero_mode_does_not_change_the_results, which holds these units too; the
    float64 reference itself would see its float32 subnormals flushed.)"""
    tensors = vector_edge_units()
    nvfp4 = RECIPE_NAMES.index("nvfp4")
    assert_matches_reference(tensors)
    assert_matches_reference(tensors, [nvfp4])
    counts, _, _ = OP(tensors, [nvfp4], None)
    blocks = [12 * 3, 8 * 9, 7 * 9]  # ceil(45 / 16) and ceil(141 / 16) blocks per row
    assert counts[:, 3 + 2].tolist() == blocks
    assert counts[1, 3 + 3] > 0  # scales flushed: the small blocks beside the 2^20 outlier


def lane_ordered_sum(squares: np.ndarray) -> float:
    """readiness_cpu.cpp's order for a unit's float64 sum: 8 lanes (element i into lane i mod 8) while 8 remain,
    the lanes added from 0 to 7, then the rest in element order."""
    full = len(squares) // 8 * 8
    lanes = [0.0] * 8
    for i in range(full):
        lanes[i % 8] += float(squares[i])
    total = 0.0
    for lane in lanes:
        total += lane
    for v in squares[full:]:
        total += float(v)
    return total


@pytest.mark.parametrize("length", [45, 128, 141])
def test_sq_signal_is_added_in_the_kernels_stated_order(length) -> None:
    """The sums are bit for bit the file header's order, whichever loops run (the cloned or the AVX2 ones): per unit
    (128 elements of a row, or the row) in lanes, the units of a chunk in order, from 0."""
    g = torch.Generator().manual_seed(length)
    x = torch.randn(9, length, generator=g) * 2.0 ** torch.randint(-40, 40, (9, 1), generator=g).float()
    x[0, -1] = -3.0
    want = 0.0
    for row in x.double().numpy():
        for start in range(0, length, 128):
            want += lane_ordered_sum(row[start : start + 128] ** 2)
    _, sums, _ = OP([x], [RECIPE_NAMES.index("mxfp8_e4m3")], None)
    assert sums[0, 0].item() == want


def test_flush_to_zero_mode_does_not_change_the_results() -> None:
    """readiness.h never hands a float32 subnormal to the FPU where it would matter: with the CPU's flush-to-zero
    and denormals-are-zero on (torch.set_flush_denormal), float32 subnormal inputs and scales give the same bits."""
    tensors = [t for t in edge_tensors() if t.numel()]
    tensors.append(torch.tensor([1e-40, 2e-39, -5e-41] + [0.0] * 13 + [1e-38] * 16))
    tensors.append(torch.tensor([2.0**-130, 2.0**-135, 2.0**-149] * 40))  # fp32 scales multiply subnormals
    rng = np.random.default_rng(14)
    tensors += [random_tensor(rng, 40 * 96, dtype).reshape(40, 96) for dtype in DTYPES]  # every binade
    tensors += [(torch.randn(16, 64, generator=torch.Generator().manual_seed(e)) * 2.0**e) for e in (-140, -125, -100)]
    tensors += nvfp4_zero_scale_units() + vector_edge_units()
    normal = OP(tensors, ALL, None)
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot set flush-to-zero")
    try:
        flushed = OP(tensors, ALL, None)
    finally:
        torch.set_flush_denormal(False)
    for a, b in zip(normal, flushed, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


CLONES_ONLY = """
import sys, torch
from amp_inspect.core import ops
assert ops.extension_loaded()
tensors = torch.load(sys.argv[1])
op = torch.ops.amp_inspect.format_readiness
torch.save([op(tensors, recipes, None) for recipes in eval(sys.argv[2])], sys.argv[3])
"""


def test_the_avx2_path_and_the_cloned_loops_give_the_same_bits(tmp_path) -> None:
    """Where the CPU has AVX2 and FMA, every unit takes the AVX2 path, so the cloned loops (CPUs without AVX2, other
    architectures) would go untested: a second process runs them (AMP_INSPECT_TEST_READINESS_CLONES, read by
    readiness_cpu.cpp) on the same tensors, and every output, each recipe alone and all together, is the same bits."""
    tensors = [t for t in edge_tensors() if t.numel()] + nvfp4_zero_scale_units() + vector_edge_units()
    tensors.append(torch.tensor([2.0**-130, 2.0**-135, 2.0**-149] * 40))
    rng = np.random.default_rng(33)
    tensors += [random_tensor(rng, 40 * 96, dtype).reshape(40, 96) for dtype in DTYPES]
    g = torch.Generator().manual_seed(33)
    for length in (1, 7, 8, 9, 15, 16, 17, 31, 33, 127, 129, 1000):
        tensors.append(
            torch.randn(3, length, generator=g) * 10.0 ** torch.empty(3, length).uniform_(-12, 6, generator=g)
        )
    recipe_sets = [ALL] + [[r] for r in range(len(RECIPE_NAMES))]
    here = [OP(tensors, recipes, None) for recipes in recipe_sets]
    torch.save(tensors, tmp_path / "tensors.pt")
    env = {**os.environ, "AMP_INSPECT_TEST_READINESS_CLONES": "1"}
    command = [
        sys.executable,
        "-c",
        CLONES_ONLY,
        str(tmp_path / "tensors.pt"),
        repr(recipe_sets),
        str(tmp_path / "out.pt"),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    there = torch.load(tmp_path / "out.pt")
    for recipes, mine, theirs in zip(recipe_sets, here, there, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), recipes


# ---------------------------------------------------------------------------------------------------------
# against torch's casts, with no reference in between


@pytest.mark.parametrize(
    ("recipe", "dtype8", "top"), [(0, torch.float8_e4m3fn, 448.0), (1, torch.float8_e5m2, 57344.0)]
)
def test_fp8_tensor_recipes_at_scale_one_are_torchs_saturating_cast(recipe, dtype8, top) -> None:
    """A given tensor amax equal to the format's max makes s = 1: v = x, and the recipe's counts and error are
    those of torch's cast of x clamped to the max (torch's own cast gives NaN/Inf above it)."""
    rng = np.random.default_rng(7)
    x = random_tensor(rng, 50000, torch.float32)
    x = x[torch.isfinite(x)]
    counts, sums, _ = OP([x], [recipe], torch.tensor([top]))
    q = x.clamp(-top, top).to(dtype8).double()
    assert counts[0, 3] == int(((x != 0) & (q == 0)).sum())
    assert counts[0, 4] == int(clamped_by_cast(x, "e4m3" if recipe == 0 else "e5m2").sum())
    assert counts[0, 5] == 1 and counts[0, 6] == 0
    want = (x.double() - q).square().sum()
    assert float(sums[0, 1]) == pytest.approx(float(want), rel=sums_rtol(x.numel()))


def test_mxfp8_blocks_are_torchs_cast_of_the_power_of_two_scaled_block() -> None:
    """MXFP8 E4M3 (OCP floor rule) on 32-element blocks: X = floor(log2 amax_b) - 8, and each element is torch's
    cast of x * 2^-X (exact) clamped to 448, times 2^X."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(64, 32, generator=g) * (2.0 ** torch.randint(-30, 30, (64, 1), generator=g))
    counts, sums, _ = OP([x], [3], None)
    exponent = torch.floor(torch.log2(x.abs().amax(1, keepdim=True).double())) - 8
    v = x.double() * torch.pow(2.0, -exponent)
    q = v.clamp(-448, 448).float().to(torch.float8_e4m3fn).double() * torch.pow(2.0, exponent)
    assert counts[0, 4] == int(clamped_by_cast(v, "e4m3").sum()) and counts[0, 5] == 64
    assert float(sums[0, 1]) == pytest.approx(float((x.double() - q).square().sum()), rel=sums_rtol(x.numel()))


# ---------------------------------------------------------------------------------------------------------
# the op as torch sees it, and its checks


@pytest.mark.parametrize(
    "args",
    [
        ([torch.randn(4, 40), torch.randn(3).bfloat16(), torch.tensor(2.0).half()], ALL, None),
        ([torch.randn(2, 33)], [7, 0], torch.tensor([3.0])),
        ([torch.zeros(0, 3), torch.randn(17)], [2], None),
    ],
)
def test_opcheck(args) -> None:
    results = torch.library.opcheck(OP, args)
    assert set(results.values()) == {"SUCCESS"}, results


def test_torch_compile_traces_the_op_through_its_fake_kernel() -> None:
    """Compiled (aot_eager: the fake kernel traces it, the real one runs), format_readiness gives the eager numbers."""
    x = torch.randn(8, 48, generator=torch.Generator().manual_seed(13))

    def sqnr(t: torch.Tensor) -> torch.Tensor:
        return amp_inspect.format_readiness([t], ("mxfp8_e4m3", "nvfp4"), tensor_amax=t.abs().amax().reshape(1)).sqnr_db

    compiled = torch.compile(sqnr, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x), sqnr(x))


def test_the_fake_kernel_has_the_ops_shapes_and_refuses_two_devices() -> None:
    tensors = [torch.randn(3, 5), torch.randn(7)]
    real = OP(tensors, [1, 4, 6], None)
    fake = OP([t.to("meta") for t in tensors], [1, 4, 6], None)
    assert [(f.shape, f.dtype, f.device.type) for f in fake] == [(r.shape, r.dtype, "meta") for r in real]
    with pytest.raises(RuntimeError, match="tensor 1 is on meta but tensor 0 is on cpu"):
        OP([tensors[0], tensors[1].to("meta")], [0], None)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (([torch.randn(3).double()], [0], None), "tensor 0 has dtype Double; expected float32, bfloat16 or float16"),
        (([torch.ones(2), torch.arange(3)], [0], None), "tensor 1 has dtype Long"),
        (([torch.ones(2)], [8], None), "recipe index 8 is out of range; there are 8 recipes"),
        (([torch.ones(2)], [-1], None), "recipe index -1 is out of range"),
        (([torch.ones(2)], [3, 3], None), r"recipe mxfp8_e4m3 \(index 3\) is asked for twice"),
        (([torch.ones(2)], [0], torch.ones(2)), r"tensor_amax must be a float32 tensor of shape \[1\]"),
        (([torch.ones(2)], [0], torch.ones(1).double()), "got dtype Double"),
        (([torch.ones(2)], [0], torch.ones(())), "got dtype Float and 0 dims"),
        (([torch.ones(2)], [0], torch.tensor([-1.0])), r"tensor_amax\[0\] is -1; an amax is >= 0"),
    ],
)
def test_bad_input_is_one_sentence(args, said) -> None:
    with pytest.raises(RuntimeError, match=said) as caught:
        OP(*args)
    message = str(caught.value)
    assert message.startswith("amp_inspect.format_readiness: ") and "\n" not in message


def test_a_meta_tensor_amax_beside_cpu_tensors_is_refused() -> None:
    with pytest.raises(RuntimeError, match="tensor_amax is on meta but tensor 0 is on cpu"):
        OP([torch.ones(2)], [0], torch.ones(1, device="meta"))


# ---------------------------------------------------------------------------------------------------------
# the Python face


def test_format_readiness_gives_every_statistic_per_tensor_and_recipe() -> None:
    g = torch.Generator().manual_seed(9)
    tensors = [torch.randn(8, 64, generator=g), torch.randn(5, generator=g).bfloat16() * 1e-3, torch.zeros(0)]
    r = amp_inspect.format_readiness(tensors)
    assert isinstance(r, ReadinessStats) and r.recipes == RECIPE_NAMES and not r.delayed and len(r) == 3
    counts, sums, amax = OP(tensors, ALL, None)
    for name, column in (("flushed", 3), ("saturated", 4), ("blocks", 5), ("scale_flushed", 6)):
        assert torch.equal(getattr(r, name), counts[:, column::4]), name
    for name, column in (("numel", 0), ("nonzero", 1), ("nonfinite", 2)):
        assert torch.equal(getattr(r, name), counts[:, column : column + 1].expand(3, 8)), name
    assert torch.equal(r.sq_error, sums[:, 1:]) and torch.equal(r.sq_signal[:, 3], sums[:, 0])
    assert torch.equal(r.amax, amax)
    assert all(torch.equal(a, b) for a, b in zip(r.outputs(), (counts, sums, amax), strict=True))
    expected_db = 10 * torch.log10(sums[0, 0] / sums[0, 1:])
    assert torch.allclose(r.sqnr_db[0], expected_db, rtol=1e-15, atol=0)
    assert r.sqnr_db[2].isnan().all() and r.flushed_fraction[2].isnan().all()  # nothing nonzero: unknown
    assert torch.equal(r.flushed_fraction[1], counts[1, 3::4].double() / counts[1, 1])


def test_named_recipes_are_their_columns_and_a_lossless_tensor_has_infinite_sqnr() -> None:
    x = torch.tensor([[1.0, -0.5, 0.25, 2.0] * 8])  # on every grid at any power-of-two scale
    r = amp_inspect.format_readiness([x], recipes=("mxfp4", "mxfp8_e5m2"))
    assert r.recipes == ("mxfp4", "mxfp8_e5m2") and r.column("mxfp8_e5m2") == 1
    assert torch.equal(r.sq_error, torch.zeros(1, 2, dtype=torch.float64)) and r.sqnr_db.isinf().all()
    with pytest.raises(KeyError, match="recipe 'nvfp4' was not asked for"):
        r.column("nvfp4")


def test_a_given_tensor_amax_is_delayed_scaling() -> None:
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(10))
    measured = amp_inspect.format_readiness([x], "fp8_e4m3_tensor")
    stale = amp_inspect.format_readiness([x], "fp8_e4m3_tensor", tensor_amax=[float(x.abs().max()) / 4])
    assert stale.delayed and not measured.delayed
    assert int(stale.saturated[0, 0]) > 0 and int(measured.saturated[0, 0]) == 0
    assert float(measured.amax[0]) == float(x.abs().max())


def test_merge_and_total_follow_the_schema() -> None:
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 96, generator=g)
    block_scaled = [n for n in RECIPE_NAMES if not n.endswith("_tensor")]
    given = x.abs().amax().reshape(1)
    whole = amp_inspect.format_readiness([x], block_scaled, tensor_amax=given)
    top = amp_inspect.format_readiness([x[:2]], block_scaled, tensor_amax=given)
    bottom = amp_inspect.format_readiness([x[2:]], block_scaled, tensor_amax=given)
    merged = top.merge(bottom)
    for name in ("numel", "nonzero", "flushed", "saturated", "blocks", "scale_flushed", "amax"):
        assert torch.equal(getattr(merged, name), getattr(whole, name)), name
    assert torch.allclose(merged.sq_error, whole.sq_error, rtol=sums_rtol(x.numel()), atol=0)
    both = amp_inspect.format_readiness([x[:2], x[2:]], block_scaled, tensor_amax=given.expand(2).contiguous())
    total = both.total()
    assert torch.equal(total.blocks, whole.blocks) and torch.equal(total.amax, whole.amax)
    with pytest.raises(ValueError, match="cannot merge readiness"):
        whole.merge(amp_inspect.format_readiness([x]))
    picked = both.select([1]).merge(both.select(slice(0, 1)))  # a module's rows, merged
    assert torch.equal(picked.flushed, whole.flushed) and list(both.as_dict()) == [s.name for s in READINESS]


@pytest.mark.parametrize(
    ("call", "error", "said"),
    [
        (lambda: amp_inspect.format_readiness([torch.ones(2).double()]), TypeError, "tensors\\[0\\] is torch.float64"),
        (lambda: amp_inspect.format_readiness(torch.ones(2)), TypeError, "wrap a single tensor"),
        (lambda: amp_inspect.format_readiness([torch.ones(2)], ["mxfp9"]), ValueError, "unknown recipe 'mxfp9'"),
        (lambda: amp_inspect.format_readiness([torch.ones(2)], []), ValueError, "recipes is empty"),
        (
            lambda: amp_inspect.format_readiness([torch.ones(2), torch.ones(2, device="meta")]),
            ValueError,
            "tensors\\[1\\] is on meta and tensors\\[0\\] on cpu",
        ),
        (lambda: amp_inspect.format_readiness([torch.ones(2)], tensor_amax=[1.0, 2.0]), ValueError, "shape \\[1\\]"),
        (lambda: amp_inspect.format_readiness([torch.ones(2)], tensor_amax=[-2.0]), ValueError, "must be >= 0"),
        (lambda: amp_inspect.format_readiness([torch.ones(2)], tensor_amax="x"), TypeError, "tensor_amax must be"),
    ],
)
def test_bad_python_input_is_one_sentence(call, error, said) -> None:
    with pytest.raises(error, match=said):
        call()


def test_no_tensors_give_empty_outputs() -> None:
    r = amp_inspect.format_readiness([], ["nvfp4"])
    assert tuple(r.flushed.shape) == (0, 1) and tuple(r.amax.shape) == (0,)


def test_a_device_without_a_kernel_gets_the_reference(monkeypatch) -> None:
    """Where the op has no kernel for the device the float64 reference serves, with one warning saying so."""
    monkeypatch.setitem(_ops.OP_KERNELS, "format_readiness", frozenset())
    monkeypatch.setattr(_ops, "_warned", set())
    x = [torch.randn(3, 40, generator=torch.Generator().manual_seed(12))]
    with pytest.warns(RuntimeWarning, match="no compiled format_readiness kernel for cpu tensors"):
        fallback = amp_inspect.format_readiness(x)
    monkeypatch.undo()
    kernel = amp_inspect.format_readiness(x)
    assert torch.equal(fallback.flushed, kernel.flushed) and torch.equal(fallback.blocks, kernel.blocks)
    assert torch.allclose(fallback.sq_error, kernel.sq_error, rtol=sums_rtol(120), atol=0)
    assert math.isfinite(float(kernel.sqnr_db[0, 0]))
