"""Format readiness's CUDA kernels (csrc/readiness/readiness_kernels.cuh) run on the CPU through the emulation
(csrc/readiness/readiness_emu.cpp: every CUDA thread of a block a host thread, real barriers, shuffles and atomics)
against the float64 reference (amp_inspect/core/references/format_readiness.py) and the CPU kernel: the counts and the
amax exactly, the sums to SUM_RTOL (all three add the same float64 terms, in other orders). Work chunks are made small
and grids chosen so that small tensors cross many chunk, block, warp-task and launch boundaries; row lengths sit on and
around every lane-group and block size, so the butterfly's caps and the short last blocks are all reached.
Marked ``cuda_emu``: no GPU needed; skipped, saying so, only where the test-only library amp_inspect._C_emu is
not built.

What this cannot see (needs a GPU): the memory model, code generation (the device branches of readiness.h's
bit casts and __clz), registers, speed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from amp_inspect.core.recipes import ELEMENT_FORMATS, RECIPE_NAMES, RECIPES
from amp_inspect.core.references.format_readiness import cast_element, format_readiness_reference

pytestmark = pytest.mark.cuda_emu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
ALL = tuple(range(len(RECIPES)))
TENSOR_SCALED = tuple(i for i, r in enumerate(RECIPES) if r.needs_tensor_amax)
BLOCK_SCALED = tuple(i for i, r in enumerate(RECIPES) if not r.needs_tensor_amax)
INLINE_VIEWS = 16  # csrc/readiness/readiness.h kReadinessInlineViews: more tensors of a dtype take more launches
WARP_TASK = 256  # elements of a row one warp task covers (32 lanes x 8)
# Both sides add the same float64 terms (readiness.h's and the reference's dequantized values are the same float64
# operations); only the order of the additions differs.
SUM_RTOL = 1e-10
# Row lengths on and around the lane group (8), the blocks (16, 32, 128) and the warp task (256).
ROW_LENGTHS = (1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 300, 520)


def emulated(tensors, recipes=ALL, tensor_amax=None, *, chunk_tasks=2, blocks=3):
    return torch.ops.amp_inspect._format_readiness_emulated(
        list(tensors), list(recipes), tensor_amax, chunk_tasks, blocks
    )


def check(tensors, recipes=ALL, tensor_amax=None, **launch):
    """The emulated kernels equal to the reference: counts and amax exactly, sums to SUM_RTOL."""
    counts, sums, amax = emulated(tensors, recipes, tensor_amax, **launch)
    want_counts, want_sums, want_amax = format_readiness_reference(tensors, recipes, tensor_amax)
    names = [RECIPE_NAMES[r] for r in recipes]
    columns = ["numel", "nonzero", "nonfinite"] + [
        f"{n}.{c}" for n in names for c in ("flushed", "saturated", "blocks", "scale_flushed")
    ]
    if not torch.equal(counts, want_counts):
        rows, cols = torch.nonzero(counts != want_counts, as_tuple=True)
        diffs = [
            f"tensor {int(t)} {tuple(tensors[int(t)].shape)} {tensors[int(t)].dtype} {columns[int(c)]}: "
            f"{int(counts[t, c])} != {int(want_counts[t, c])}"
            for t, c in zip(rows[:8], cols[:8], strict=True)
        ]
        raise AssertionError(f"counts differ ({launch}): " + "; ".join(diffs))
    assert torch.equal(amax.view(torch.int32), want_amax.view(torch.int32)), f"amax {amax} != {want_amax}"
    torch.testing.assert_close(sums, want_sums, rtol=SUM_RTOL, atol=0.0)
    # And the CPU kernel, which runs the same readiness.h on its own tiling: the same outputs.
    cpu_counts, cpu_sums, cpu_amax = torch.ops.amp_inspect.format_readiness(list(tensors), list(recipes), tensor_amax)
    assert torch.equal(counts, cpu_counts) and torch.equal(amax, cpu_amax)
    torch.testing.assert_close(sums, cpu_sums, rtol=SUM_RTOL, atol=0.0)
    return counts, sums, amax


def random_bits(rng: np.random.Generator, shape, dtype: torch.dtype) -> torch.Tensor:
    """Every bit pattern of the dtype equally likely: NaN, Inf, subnormals, zeros of both signs included."""
    n = int(np.prod(shape)) if shape else 1
    if dtype == torch.float32:
        words = torch.from_numpy(rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.int32))
        return words.view(torch.float32).reshape(shape)
    words = torch.from_numpy(rng.integers(0, 2**16, n, dtype=np.uint32).astype(np.uint16).view(np.int16))
    return words.view(dtype).reshape(shape)


def gaussian(rng: np.random.Generator, shape, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).to(dtype)


def edge_rows(dtype: torch.dtype) -> torch.Tensor:
    """Rows of 128 elements, one edge of the rules each (the issue's list), written with values the dtype holds
    exactly where it can: a block whose amax is a power of two; elements at the element formats' max, just above
    it and at half their smallest subnormal after the block's scale; a block of zeros; a block holding one NaN or
    an Inf; blocks far below the tensor's amax (NVFP4's E4M3 block scale goes subnormal or to zero); a tiny block
    (E8M0 clamped at 2^-127, the fp32 scale's division overflowing to FLT_MAX)."""
    tiny = torch.finfo(dtype).tiny
    rows = []
    base = torch.linspace(-1.0, 1.0, 128, dtype=torch.float64)
    rows.append(base * 4.0)  # amax 4: a power of two
    for fmt in ELEMENT_FORMATS.values():
        top = fmt.max_value
        row = base.clone() * top / 8
        row[:8] = torch.tensor(
            [top, -top, top * 1.0625, top * 1.25, fmt.min_subnormal / 2, fmt.min_subnormal, 1.0, -1.0]
        )
        rows.append(row)
    rows.append(torch.zeros(128, dtype=torch.float64))
    with_nan = base.clone()
    with_nan[5] = float("nan")
    rows.append(with_nan)
    with_inf = base.clone() * 3
    with_inf[64] = float("inf")
    with_inf[100] = float("-inf")
    rows.append(with_inf)
    for shrink in (2.0**-10, 2.0**-14, 2.0**-18, 2.0**-24):  # far below the tensor's amax (4 * 2^8 below)
        rows.append(base * shrink)
    rows.append(base * tiny * 4)  # the dtype's smallest normals
    rows.append(torch.full((128,), tiny, dtype=torch.float64))
    big = base.clone() * torch.finfo(dtype).max / 2
    rows.append(big)
    x = torch.stack(rows).to(dtype)
    x[1, 1:16] = x[1, 0]  # a 16-element block at the element max
    return x


# ---- the rules at their edges ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_each_recipe_at_its_edges(recipe, dtype):
    """Each recipe alone on the edge rows, and with its tensor amax given far above and below the measured one."""
    r = RECIPE_NAMES.index(recipe)
    x = edge_rows(dtype)
    counts, _, _ = check([x], [r])
    assert counts[0, 3 + 2] == (1 if RECIPES[r].block == 0 else x.shape[0] * (128 // RECIPES[r].block)), "blocks"
    amax = float(torch.nan_to_num(x.float(), nan=0.0, posinf=0.0, neginf=0.0).abs().max())
    for given in (amax, amax * 2.0**-20, amax * 2.0**10 if amax < 1e30 else 1.0, 0.0):
        check([x], [r], torch.tensor([given], dtype=torch.float32))


def test_edges_show_each_count_somewhere():
    """The edge rows make every recipe flush and saturate something, and the scale limits appear: the test
    above is not passing on zeros."""
    counts, sums, _ = check([edge_rows(torch.float32)], ALL)
    per_recipe = counts[0, 3:].view(len(RECIPES), 4)
    assert (per_recipe[:, 0] > 0).all(), f"flushed {per_recipe[:, 0]}"
    # The OCP floor rule maps a block's amax into the top binade, where values the cast clamps occur (the
    # fp32 and RCEIL scales map the amax to max_E or below; NVFP4's s_b rounds down by less than 7/6 unless it
    # is an E4M3 subnormal, so its clamps are left to the reference's tests of subnormal block scales).
    floor_rules = [i for i, r in enumerate(RECIPES) if r.scale == "e8m0_floor"]
    assert (per_recipe[floor_rules, 1] > 0).all(), f"saturated {per_recipe[:, 1]}"
    nvfp4 = RECIPE_NAMES.index("nvfp4")
    assert per_recipe[nvfp4, 3] > 0, "an NVFP4 block scale flushed"
    assert per_recipe[RECIPE_NAMES.index("mxfp8_e4m3"), 3] > 0, "an E8M0 scale clamped"
    assert (sums[0, 1:] > 0).all()


def test_tensor_scale_overflow_counts_one_block():
    """A tensor whose amax is the smallest subnormal: 448 / amax overflows, the scale is FLT_MAX (at its limit)."""
    x = torch.tensor([[2.0**-149, 0.0, -(2.0**-149)]], dtype=torch.float32)
    counts, _, _ = check([x], [0, 1])
    assert counts[0, 3 + 3].item() == 1 and counts[0, 7 + 3].item() == 1


# ---- random bit patterns, every dtype, every row length ----


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_random_bit_patterns_every_row_length(dtype, rng):
    tensors = [random_bits(rng, (3, n), dtype) for n in ROW_LENGTHS]
    check(tensors, ALL, chunk_tasks=3, blocks=4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gaussian_rows_every_row_length(dtype, rng):
    """Values a model holds, where the recipes keep most of them: the sums are large and must still agree."""
    tensors = [gaussian(rng, (2, n), dtype, scale=10.0 ** (i % 5 - 2)) for i, n in enumerate(ROW_LENGTHS)]
    check(tensors, ALL, chunk_tasks=1, blocks=5)


def test_rows_shorter_than_a_warp_task_are_packed(rng):
    """Many short rows share a warp task (32 / P rows each): none may leak into a neighbour's block."""
    shapes = [(97, 1), (45, 3), (33, 8), (21, 9), (40, 17), (19, 33), (7, 100), (5, 129), (2, 3, 5), (4, 2, 31)]
    tensors = [random_bits(rng, s, DTYPES[i % 3]) for i, s in enumerate(shapes)]
    check(tensors, ALL, chunk_tasks=1, blocks=3)
    check([gaussian(rng, s, torch.float32) for s in shapes], ALL, chunk_tasks=2, blocks=2)


def test_neighbouring_rows_of_very_different_scale(rng):
    """Alternate rows 2^40 apart: a block that took its neighbour row's amax would flush everything."""
    for n in (3, 16, 20, 32, 100):
        x = gaussian(rng, (12, n), torch.float32)
        x[::2] *= 2.0**20
        x[1::2] *= 2.0**-20
        counts, _, _ = check([x], BLOCK_SCALED, chunk_tasks=1, blocks=2)
        flushed = counts[0, 3::4]
        assert (flushed[:3] == 0).all(), f"row length {n}: fp8/mxfp8 blocks flushed {flushed}"


# ---- launches: chunks, grids, views, the amax passes ----


@pytest.mark.parametrize("chunk_tasks", [1, 2, 5, 16])
@pytest.mark.parametrize("blocks", [1, 2, 7, 40])
def test_chunks_and_grids(chunk_tasks, blocks, rng):
    """Grids smaller and larger than the chunk count (blocks without chunks idle), chunks of 1 to 16 tasks."""
    tensors = [gaussian(rng, (3, 300), torch.bfloat16), random_bits(rng, (50, 7), torch.float16), torch.randn(1100)]
    check(tensors, ALL, chunk_tasks=chunk_tasks, blocks=blocks)


def test_more_tensors_than_fit_in_one_launch(rng):
    """66 tensors of three dtypes, empty and 0-d ones among them: several launches per dtype, outputs by row."""
    sizes = rng.integers(0, 120, 66)
    tensors = []
    for i, n in enumerate(sizes):
        dtype = DTYPES[i % 3]
        if i % 11 == 4:
            tensors.append(torch.tensor(float(n) - 50.0, dtype=dtype))
        elif i % 13 == 6:
            tensors.append(torch.empty(0, 4, dtype=dtype))
        else:
            tensors.append(random_bits(rng, (int(n) % 5 + 1, int(n) + 1), dtype))
    assert sum(t.dtype == torch.float32 and t.numel() > 0 for t in tensors) > INLINE_VIEWS
    check(tensors, ALL, chunk_tasks=2, blocks=3)
    check(tensors, (7, 3, 0), chunk_tasks=1, blocks=2)


def test_empty_and_zero_dim_tensors(rng):
    tensors = [torch.empty(0), torch.tensor(3.0), torch.empty(3, 0, dtype=torch.float16), torch.tensor(-0.0)]
    tensors.append(torch.tensor(float("nan"), dtype=torch.bfloat16))
    counts, sums, amax = check(tensors, ALL)
    assert counts[:, 0].tolist() == [0, 1, 0, 1, 1]
    assert counts[0].eq(0).all() and counts[2].eq(0).all(), "an empty tensor has no blocks"
    assert counts[4, 2].item() == 1 and amax[4].item() == 0.0
    check([torch.empty(0), torch.tensor(2.0)], ALL, torch.tensor([5.0, 1.0]))


@pytest.mark.parametrize("recipes", [BLOCK_SCALED, TENSOR_SCALED, (7,), (0,), (6, 2), ALL], ids=str)
def test_amax_measured_in_the_main_pass_or_first(recipes, rng):
    """Without a tensor-scaled recipe the main pass measures the amax; with one, a first pass does: both give
    the finite amax, NaN and Inf left out."""
    tensors = [random_bits(rng, (4, 70), torch.float32), gaussian(rng, (9, 33), torch.float16), torch.zeros(5)]
    _, _, amax = check(tensors, recipes)
    assert amax[2].item() == 0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_amax_pass_reads_heads_vectors_in_flight_and_tails(dtype, rng):
    """The first pass (a tensor-scaled recipe, no tensor_amax) reads each view as 16-byte vectors, several per thread
    at a time, and the elements before the first 16-byte boundary and after the last vector one at a time: a
    tensor's largest finite magnitude (negative, NaN and Inf beside it, larger) is found wherever it sits, for
    starts on and off the boundary. One block of 256 threads, so that each thread's later vectors are read too."""
    per_vector = 16 // torch.tensor([], dtype=dtype).element_size()
    threads, in_flight = 256, 4  # one block; readiness_kernels.cuh's kAmaxVectorsInFlight
    numel = 2 * threads * in_flight * per_vector + 13  # two rounds of every thread's vectors, and a tail
    positions = (0, 1, per_vector * threads + 3, per_vector * threads * 3 + 1, numel // 2 + 5, numel - 1)
    for offset in (0, 1, per_vector - 1):
        tensors = []
        for at in positions:
            flat = gaussian(rng, (numel + per_vector,), dtype, scale=0.25).clamp(-1.0, 1.0)
            x = flat[offset : offset + numel]
            x[at] = -3.5
            x[(at + 7) % numel] = float("inf")
            x[(at + 11) % numel] = float("nan")
            x[(at + 17) % numel] = float("-inf")
            tensors.append(x.view(-1, 1) if at % 2 else x.view(1, -1))
        _, _, amax = check(tensors, (RECIPE_NAMES.index("fp8_e4m3_tensor"),), chunk_tasks=64, blocks=1)
        assert amax.tolist() == [3.5] * len(positions), f"offset {offset}"
    # Shorter than one vector, and a single element off the boundary.
    flat = gaussian(rng, (40,), dtype)
    check([flat[1:4], flat[3:4], flat[: per_vector - 1]], (RECIPE_NAMES.index("nvfp4"),), chunk_tasks=1, blocks=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_given_tensor_amax_is_used_and_returned(dtype, rng):
    """Delayed scaling: the given amax sets the tensor scales (far below the real one: saturation; above it:
    flushing), is returned as given, and block-scaled recipes ignore it."""
    x = gaussian(rng, (6, 100), dtype)
    real = float(x.float().abs().max())
    for given in (real / 64, real, real * 2.0**12):
        amax_t = torch.tensor([given, 1.0], dtype=torch.float32)
        counts, _, amax = check([x, torch.ones(3, dtype=dtype)], ALL, amax_t)
        assert torch.equal(amax, amax_t)
    low = emulated([x], (0,), torch.tensor([real / 64]))[0]
    assert low[0, 4] > 0, "an amax far below the real one saturates"
    blocks_only = [emulated([x], BLOCK_SCALED, torch.tensor([g]))[0] for g in (real / 64, real * 8)]
    assert torch.equal(blocks_only[0], blocks_only[1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_unaligned_starts_and_non_contiguous_inputs(dtype, rng):
    """Rows that start off a 16-byte boundary take the scalar loads, aligned full groups the vector loads; a
    transposed tensor is read as its contiguous copy (blocks along its last dim as given)."""
    flat = gaussian(rng, (4 * 256 + 3,), dtype)
    tensors = [flat[1 : 1 + 4 * 256].view(4, 256), flat[3:].view(-1, 1), flat[:1024].view(4, 256)]
    tensors.append(gaussian(rng, (64, 48), dtype).t())
    tensors.append(gaussian(rng, (8, 40, 6), dtype)[:, ::2, :])
    check(tensors, ALL, chunk_tasks=2, blocks=3)


def test_recipe_order_and_subsets_follow_the_slots(rng):
    """Any subset in any order: each recipe's columns land in its slot."""
    tensors = [random_bits(rng, (3, 150), torch.float32), gaussian(rng, (5, 40), torch.bfloat16)]
    full = emulated(tensors, ALL)
    order = (5, 0, 7, 2)
    counts, sums, _ = check(tensors, order)
    for slot, r in enumerate(order):
        assert torch.equal(counts[:, 3 + 4 * slot : 7 + 4 * slot], full[0][:, 3 + 4 * r : 7 + 4 * r])
        assert torch.equal(sums[:, 1 + slot], full[1][:, 1 + r])


def test_bad_arguments_are_one_sentence():
    x = torch.ones(4)
    with pytest.raises(RuntimeError, match="recipe index 8"):
        emulated([x], [8])
    with pytest.raises(RuntimeError, match="asked for twice"):
        emulated([x], [1, 1])
    with pytest.raises(RuntimeError, match="dtype"):
        emulated([x.double()], [1])
    with pytest.raises(RuntimeError, match="tensor_amax must be a float32 tensor of shape"):
        emulated([x], [0], torch.ones(2))


# ---- issue 33: the kernels specialised by recipe, and the fp32 rules' dequantization without a division ----


@pytest.mark.parametrize("mbits", (3, 2, 1), ids=("e4m3", "e5m2", "e2m1"))
def test_grid_quotient_is_the_division_for_every_scale_mantissa(mbits):
    """readiness.h's grid_quotient (one reciprocal per block, Markstein's correction per element) equals the
    float64 division q / s for every element-grid significand q and every float32 mantissa of s: all the cases."""
    assert torch.ops.amp_inspect._readiness_quotient_mismatches(mbits) == 0
    with pytest.raises(RuntimeError, match="mbits must be 1, 2 or 3"):
        torch.ops.amp_inspect._readiness_quotient_mismatches(4)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_each_recipes_own_kernel_equals_its_columns_of_every_recipe(dtype, rng):
    """A one-recipe call runs that recipe's own kernel, a call of none the no-recipe kernel: the same counts and
    sums as the every-recipe kernel's columns, on data with NaN, Inf, subnormals and zeros, packed short rows
    and long ones."""
    tensors = [random_bits(rng, (3, 300), dtype), gaussian(rng, (9, 20), dtype), edge_rows(dtype)]
    full_counts, full_sums, full_amax = emulated(tensors, ALL)
    for r in ALL:
        counts, sums, amax = check(tensors, (r,))
        assert torch.equal(counts[:, :3], full_counts[:, :3])
        assert torch.equal(counts[:, 3:], full_counts[:, 3 + 4 * r : 7 + 4 * r])
        assert torch.equal(sums[:, 0], full_sums[:, 0]) and torch.equal(sums[:, 1], full_sums[:, 1 + r])
        if r in BLOCK_SCALED:
            assert torch.equal(amax, full_amax)
    counts, sums, amax = check(tensors, ())
    assert counts.shape == (3, 3) and torch.equal(counts, full_counts[:, :3])
    assert torch.equal(sums[:, 0], full_sums[:, 0]) and torch.equal(amax, full_amax)


def test_counts_of_a_lane_past_sixteen_bits_between_flushes():
    """The kernels keep two counts per 32-bit word, 16 bits each, and flush them at least every
    kMaxWarpTasksPerFlush (8191) tasks of a warp. One block of 8 warps over 17M elements (8200 tasks a warp,
    65,600 elements a lane): counts that wrapped at 2^16, or spilled into the other half of their word, would
    differ from the CPU kernel's. Nearly every element flushes in the block-scaled recipes (2^-20 beside a 1 in
    every 32), so flushed counts reach the most."""
    rows = 8 * 8200
    x = torch.full((rows, WARP_TASK), 2.0**-20, dtype=torch.float16)
    x[:, ::32] = 1.0
    x[::7, 5] = 0.0
    for recipes in (ALL, (RECIPE_NAMES.index("mxfp8_e4m3"),)):
        counts, _, amax = emulated([x], recipes, chunk_tasks=1 << 20, blocks=1)
        cpu_counts, _, cpu_amax = torch.ops.amp_inspect.format_readiness([x], list(recipes), None)
        assert torch.equal(counts, cpu_counts), (counts, cpu_counts)
        assert int(counts[0, 0]) == x.numel() and torch.equal(amax, cpu_amax)
        assert int(counts[0, 3 + 4 * recipes.index(RECIPE_NAMES.index("mxfp8_e4m3"))]) > 2**23  # flushed


# ---- issue 33: NVFP4 without a float32 division per element ----

FLOAT32_MAX = float(np.finfo(np.float32).max)
NVFP4 = RECIPE_NAMES.index("nvfp4")


def float32_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float32).view(np.uint32))


def test_divide_by_reciprocal_is_the_float32_division():
    """readiness.h's divide_by_reciprocal, fl32(a * fl64(1 / b)), equals the float32 division a / b for every
    float32 mantissa of b against a's nearest two random midpoints of fl32 each (and their neighbours), and for a
    million random pairs; a planted rounding too many (a float32 reciprocal) is found, so the check has teeth."""
    assert torch.ops.amp_inspect._readiness_divide_mismatches(2, 10**6, 33, False) == 0
    assert torch.ops.amp_inspect._readiness_divide_mismatches(1, 10**5, 33, True) > 0


@pytest.mark.parametrize("decode", (1.0, 2.0**-126, 0.0123456789, FLOAT32_MAX / 2688), ids=("one", "min", "odd", "max"))
def test_nvfp4_block_scale_without_division_equals_nvfp4_scale(decode):
    """nvfp4_block_scale_bits, where the kernels take it (total a normal float32), gives nvfp4_scale's scale and
    scale_flushed for every amax_b whose wanted scale amax_b / 6 / d lies within 2^-12 .. 2^11 (E4M3's subnormals,
    normals and saturation, with a binade's margin), all 2^23 mantissas of each binade."""
    d = float32_bits(decode)
    centre = int(np.floor(np.log2(6.0 * np.float32(decode)))) + 127
    first, last = max(1, centre - 12), min(254, centre + 11)
    mismatches, lane_path = torch.ops.amp_inspect._readiness_nvfp4_scale_mismatches(d, first, last)
    assert mismatches == 0
    assert lane_path > (last - first) * 2**22  # most blocks take the lane path


def test_nvfp4_elements_at_and_beside_every_e2m1_tie():
    """The nvfp4 kernel's v = fl32(x / total), now fl32(x * fl64(1 / total)), where it matters most: x / total at
    and one or two float32 steps beside every E2M1 rounding tie and the saturation bound, under many irregular totals
    (s_b saturated at 448, normal, and E4M3-subnormal). Equal to the reference and the CPU kernel; and the data is
    such that a float32 reciprocal would cast some of these elements differently (the guard has teeth)."""
    rng = np.random.default_rng(33)
    tensor_amax = np.float32(1000.0)
    d = tensor_amax / np.float32(2688.0)
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0], dtype=np.float64)  # 7: E2M1's clip_bits
    blocks, planted_differs = [], 0
    e2m1 = ELEMENT_FORMATS["e2m1"]
    # amax_b above tensor_amax (a stale given amax) saturates s_b at 448: x / total then reaches the clip; below about
    # 0.035, s_b is an E4M3 subnormal (a flushed scale).
    amaxes = np.concatenate([rng.uniform(0.01, 3000.0, 600), 2.0 ** rng.uniform(-8.0, 12.0, 200)]).astype(np.float32)
    for amax_b in amaxes:
        wanted = np.minimum(amax_b / np.float32(6.0) / d, np.float32(448.0))
        s_b = torch.tensor(wanted).to(torch.float8_e4m3fn).float().numpy()
        total = np.float32(np.float64(d) * np.float64(s_b))
        near = np.float32(ties * np.float64(total))
        steps = np.arange(-2, 3, dtype=np.int32)
        x = (near.view(np.int32)[:, None] + steps[None, :]).reshape(-1).view(np.float32)
        x = x[x < amax_b]
        x = np.where(rng.integers(0, 2, x.size) == 1, -x, x).astype(np.float32)
        v = torch.from_numpy(x / total)
        planted = torch.from_numpy(x * np.float32(1.0 / np.float64(total)))
        planted_differs += int((cast_element(v, e2m1) != cast_element(planted, e2m1)).sum())
        for start in range(0, x.size, 15):
            block = np.zeros(16, dtype=np.float32)
            block[0] = amax_b
            chunk = x[start : start + 15]
            block[1 : 1 + chunk.size] = chunk
            blocks.append(block)
    blocks += [np.zeros(16, dtype=np.float32)] * (-len(blocks) % 4)
    data = torch.from_numpy(np.concatenate(blocks)).reshape(-1, 64)
    assert planted_differs > 0
    counts, _, _ = check([data], (NVFP4,), torch.tensor([float(tensor_amax)]))
    assert counts[0, 4] > 0 and counts[0, 6] > 0  # saturated elements and flushed scales are among them
    check([data], ALL, torch.tensor([float(tensor_amax)]))
