"""Oracle tests of the float64 reference of format readiness (amp_inspect/core/references/format_readiness.py).

Independent of the reference where they can be: its element casts against torch's own float8 casts (and the
E2M1 grid written out by hand) on every float32 boundary value and its bit neighbours; each recipe at its
edges with the expected dequantized values written here from the grid and the rule; and invariants any
correct implementation keeps (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from amp_inspect.core.recipes import ELEMENT_FORMATS, RECIPE_NAMES, RECIPES, RECIPES_BY_NAME
from amp_inspect.core.references.format_readiness import (
    COUNTS_PER_RECIPE,
    COUNTS_PER_TENSOR,
    cast_element,
    format_readiness_reference,
)
from tests.oracles import READINESS_CLAMPED_FROM, clamped_by_cast

NAN, INF = float("nan"), float("inf")
FLT_MAX = float(torch.finfo(torch.float32).max)
TORCH_FLOAT8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
# OCP FP4 E2M1, codes 0..7: the code's last bit is the mantissa bit, so "ties to even" is "to the even code"
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


# ---------------------------------------------------------------------------------------------------------
# helpers


def readiness(tensor, recipe: str, tensor_amax: float | None = None) -> dict[str, float]:
    """The reference's numbers for one tensor and one recipe, by name."""
    given = None if tensor_amax is None else torch.tensor([tensor_amax], dtype=torch.float32)
    counts, sums, amax = format_readiness_reference([tensor], [RECIPE_NAMES.index(recipe)], given)
    row = counts[0].tolist()
    out = dict(zip(COUNTS_PER_TENSOR + COUNTS_PER_RECIPE, row, strict=True))
    out["sq_signal"], out["sq_error"] = sums[0].tolist()
    out["amax"] = float(amax[0])
    return out


def f32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def f32_neighbours(values: np.ndarray) -> np.ndarray:
    """Each float32 value, its bit pattern -1 and +1 (toward zero and away from it), both signs."""
    v = np.abs(np.asarray(values, dtype=np.float32))
    bits = v.view(np.int32)
    around = np.concatenate([bits, bits - 1, bits + 1])
    around = around[(around >= 0) & (around <= 0x7F800000)]  # 0 and up to +inf
    positive = around.view(np.float32)
    return np.unique(np.concatenate([positive, -positive]))


def grid_boundaries(fmt_name: str) -> np.ndarray:
    """Every value of the format's grid (from torch's float8 codes, or the E2M1 table), every halfway point
    between neighbours (the ties), half the smallest subnormal, the max, halfway above the max (what the next
    grid step would have been), 2x the max, as float32, with their bit neighbours."""
    fmt = ELEMENT_FORMATS[fmt_name]
    if fmt_name in TORCH_FLOAT8:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(TORCH_FLOAT8[fmt_name]).float()
        grid = np.unique(np.abs(codes[torch.isfinite(codes)].numpy().astype(np.float64)))
    else:
        grid = np.array(E2M1_GRID)
    ulp_at_max = 2.0 ** (math.floor(math.log2(fmt.max_value)) - fmt.mbits)
    special = [fmt.min_subnormal / 2, fmt.max_value, fmt.max_value + ulp_at_max / 2, 2 * fmt.max_value, FLT_MAX]
    halfway = (grid[1:] + grid[:-1]) / 2
    values = np.concatenate([grid, halfway, special]).astype(np.float32)
    assert np.all(values.astype(np.float64)[: len(grid) + len(halfway)] == np.concatenate([grid, halfway]))
    return f32_neighbours(values)


def e2m1_by_hand(v: np.ndarray) -> np.ndarray:
    """Nearest E2M1 value, ties to the even code, saturating at 6 (an oracle with no arithmetic of the grid)."""
    grid = np.array(E2M1_GRID)
    a = np.minimum(np.abs(v.astype(np.float64)), 6.0)
    distance = np.abs(a[:, None] - grid[None, :])
    best = distance.min(axis=1, keepdims=True)
    candidates = distance == best
    even = candidates & (np.arange(8) % 2 == 0)[None, :]
    code = np.where(even.any(axis=1), even.argmax(axis=1), candidates.argmax(axis=1))
    return np.copysign(grid[code], v)


# ---------------------------------------------------------------------------------------------------------
# the element casts against torch's casts and the hand grid


@pytest.mark.parametrize("fmt_name", ["e4m3", "e5m2"])
def test_fp8_cast_matches_torch_cast_on_every_boundary_and_neighbour(fmt_name):
    """Torch's float8 conversion (RNE with subnormals; pre-clamped, so saturating) agrees with cast_E on
    every grid value, every tie between grid values, half the smallest subnormal (a tie to zero), the max and
    above it, and each one's float32 neighbours."""
    fmt = ELEMENT_FORMATS[fmt_name]
    v = torch.from_numpy(grid_boundaries(fmt_name))
    expected = v.clamp(-fmt.max_value, fmt.max_value).to(TORCH_FLOAT8[fmt_name]).double()
    got = cast_element(v, fmt)
    assert got.dtype == torch.float64
    wrong = (got != expected).nonzero().flatten()
    assert len(wrong) == 0, [(float(v[i]), float(got[i]), float(expected[i])) for i in wrong[:5]]
    assert len(v) > 1000  # the boundaries really were enumerated


def test_fp8_cast_named_edges():
    """The edges by name, so a failure says which: ties to zero, to even, saturation."""
    e4m3, e5m2 = ELEMENT_FORMATS["e4m3"], ELEMENT_FORMATS["e5m2"]
    cases = [
        (e4m3, 2.0**-10, 0.0),  # half the smallest subnormal: a tie, to zero (even)
        (e4m3, float(np.nextafter(np.float32(2**-10), np.float32(1))), 2.0**-9),  # just above it
        (e4m3, 3 * 2.0**-10, 2 * 2.0**-9),  # 1.5 subnormal steps: the tie goes to the even 2
        (e4m3, 1.0625, 1.0),  # halfway between 1 and 1.125: to the even mantissa
        (e4m3, 1.1875, 1.25),
        (e4m3, 448.0, 448.0),
        (e4m3, 464.0, 448.0),  # halfway to the absent 480
        (e4m3, 1e30, 448.0),
        (e4m3, INF, 448.0),
        (e4m3, -INF, -448.0),
        (e5m2, 2.0**-17, 0.0),
        (e5m2, 61440.0, 57344.0),  # would round to Inf without saturation
        (e5m2, -1e38, -57344.0),
    ]
    for fmt, v, expected in cases:
        assert float(cast_element(f32([v]), fmt)[0]) == expected, (fmt.name, v)


def test_e2m1_cast_matches_the_hand_grid():
    """cast_E2M1 against the eight values written out, on every value, tie and neighbour, both signs."""
    v = grid_boundaries("e2m1")
    expected = e2m1_by_hand(v)
    got = cast_element(torch.from_numpy(v), ELEMENT_FORMATS["e2m1"]).numpy()
    assert np.array_equal(got, expected), v[got != expected][:5]
    # the ties by name: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4, 7 -> 6 (saturated)
    ties = f32([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])
    assert cast_element(ties, ELEMENT_FORMATS["e2m1"]).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]


# ---------------------------------------------------------------------------------------------------------
# the op's shape


def test_outputs_have_the_ops_shapes_dtypes_and_columns():
    tensors = [torch.randn(3, 70), torch.tensor(2.0), torch.zeros(0, 4), torch.randn(5).half()]
    recipes = [6, 0, 3]
    counts, sums, amax = format_readiness_reference(tensors, recipes)
    assert counts.shape == (4, 3 + 4 * 3) and counts.dtype == torch.int64
    assert sums.shape == (4, 1 + 3) and sums.dtype == torch.float64
    assert amax.shape == (4,) and amax.dtype == torch.float32
    # numel; blocks per recipe in the order asked (mxfp4: 3 rows x ceil(70/32); the tensor recipe: one)
    assert counts[:, 0].tolist() == [210, 1, 0, 5]
    assert counts[0, 3 + 2].item() == 3 * 3 and counts[0, 3 + 4 + 2].item() == 1 and counts[0, 3 + 8 + 2] == 9
    assert counts[1, 3 + 2].item() == 1  # a 0-d tensor is one block of one element
    assert counts[2].tolist() == [0] * 15 and sums[2].tolist() == [0.0] * 4 and amax[2].item() == 0.0
    assert amax[1].item() == 2.0
    assert sums[0, 0].item() == pytest.approx(tensors[0].double().square().sum().item(), rel=1e-12)


def test_blocks_run_along_the_last_dimension_as_given():
    """A transposed view is blocked along its own last dimension (as its contiguous copy), not along memory;
    a tensor that requires grad is read, not changed."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(40, 64, generator=g) * torch.logspace(-4, 4, 64)).requires_grad_()
    view = x.t()
    before = x.detach().clone()
    a = format_readiness_reference([view], range(len(RECIPES)))
    b = format_readiness_reference([view.detach().contiguous()], range(len(RECIPES)))
    c = format_readiness_reference([x.detach()], range(len(RECIPES)))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])  # blocked the other way, the numbers differ
    assert torch.equal(x.detach(), before) and x.grad is None


def test_no_tensors_and_bad_input():
    counts, sums, amax = format_readiness_reference([], [0, 1])
    assert counts.shape == (0, 11) and sums.shape == (0, 3) and amax.shape == (0,)
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        format_readiness_reference([torch.zeros(3, dtype=torch.float64)], [0])
    with pytest.raises(ValueError, match="out of range"):
        format_readiness_reference([torch.zeros(3)], [len(RECIPES)])
    with pytest.raises(ValueError, match="shape \\[2\\]"):
        format_readiness_reference([torch.zeros(3), torch.zeros(3)], [0], torch.zeros(1))


def test_given_tensor_amax_is_used_and_returned():
    """Delayed scaling: a stale amax half the real one saturates what is above it; the amax returned is it."""
    x = f32([1.0, 2.0, 4.0, 8.0])
    measured = readiness(x, "fp8_e4m3_tensor")
    delayed = readiness(x, "fp8_e4m3_tensor", tensor_amax=4.0)
    assert measured["amax"] == 8.0 and measured["saturated"] == 0 and measured["sq_error"] == 0.0
    # s = 448 / 4 = 112; 8 * 112 = 896 > 448 saturates to 448, dequantized 4: error (8 - 4)^2
    assert delayed["amax"] == 4.0 and delayed["saturated"] == 1 and delayed["sq_error"] == 16.0


@pytest.mark.parametrize("stale", [0.0, INF, NAN])
def test_given_tensor_amax_of_zero_inf_or_nan_gives_the_unit_scale(stale):
    """As TransformerEngine does. fp8_e4m3_tensor: s = 1, so 500 saturates to 448 and 1, 3 are exact.
    nvfp4: d = 1, so s_b = cast_E4M3(fl32(500 / 6) = 83.33) = 80 (spacing 8 at 64..128), total 80:
    1 / 80 and 3 / 80 fall below E2M1's 0.25 (flushed), 500 / 80 = 6.25 rounds to 6 (below 7, where the cast
    would clamp: not saturated), dequantized 480."""
    x = f32([1.0, 3.0, 500.0])
    fp8 = readiness(x, "fp8_e4m3_tensor", tensor_amax=stale)
    assert fp8["saturated"] == 1 and fp8["flushed"] == 0 and fp8["sq_error"] == 52.0**2
    nvfp4 = readiness(x, "nvfp4", tensor_amax=stale)
    assert nvfp4["saturated"] == 0 and nvfp4["flushed"] == 2 and nvfp4["sq_error"] == 1.0 + 9.0 + 20.0**2
    assert nvfp4["scale_flushed"] == 0
    assert math.isnan(fp8["amax"]) if math.isnan(stale) else fp8["amax"] == stale  # the amax used, as given


# ---------------------------------------------------------------------------------------------------------
# each recipe at its edges


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
def test_block_of_zeros_loses_nothing(recipe):
    r = readiness(torch.zeros(2, 40), recipe)
    block = RECIPES_BY_NAME[recipe].block
    blocks = 1 if block == 0 else 2 * math.ceil(40 / block)
    assert r == {
        "numel": 80, "nonzero": 0, "nonfinite": 0, "flushed": 0, "saturated": 0, "blocks": blocks,
        "scale_flushed": 0, "sq_signal": 0.0, "sq_error": 0.0, "amax": 0.0,
    }  # fmt: skip


@pytest.mark.parametrize("recipe", RECIPE_NAMES)
@pytest.mark.parametrize("bad", [NAN, INF, -INF])
def test_nan_or_inf_is_counted_and_left_out(recipe, bad):
    """A block holding one NaN/Inf: counted in nonfinite, out of the amax (so out of every scale) and out of
    the sums: the rest of the tensor gives what it gives with a 0 there (a 0 loses nothing and moves no amax)."""
    x = torch.linspace(-3.0, 5.0, 64).reshape(2, 32)
    poisoned, zeroed = x.clone(), x.clone()
    poisoned[1, 7], zeroed[1, 7] = bad, 0.0
    got, expected = readiness(poisoned, recipe), readiness(zeroed, recipe)
    assert got["nonfinite"] == 1 and expected["nonfinite"] == 0
    assert got["nonzero"] == expected["nonzero"] == 63  # neither a NaN/Inf nor a 0 is a finite nonzero
    for key in ("flushed", "saturated", "blocks", "scale_flushed", "sq_signal", "sq_error", "amax"):
        assert got[key] == expected[key], key


def test_all_nonfinite_tensor_has_amax_zero():
    r = readiness(f32([NAN, INF]), "nvfp4")
    assert r["amax"] == 0.0 and r["nonfinite"] == 2 and r["sq_error"] == 0.0 and r["flushed"] == 0


@pytest.mark.parametrize(("recipe", "top"), [("fp8_e4m3_tensor", 448.0), ("fp8_e5m2_tensor", 57344.0)])
def test_tensor_scale_at_the_element_max_and_just_above(recipe, top):
    """With a given amax of max_E the scale is exactly 1: the max and the next float32 above it are not
    saturated (the cast rounds that one to the max as any value rounds to its neighbour), nor the last float32
    before the first value the cast clamps; that value is, and 2 max_E; each of these dequantizes to the max."""
    element = RECIPES_BY_NAME[recipe].element
    above = float(np.nextafter(np.float32(top), np.float32(INF)))
    clamped = READINESS_CLAMPED_FROM[element]
    last_kept = float(np.nextafter(np.float32(clamped), np.float32(0.0)))
    far = 2 * top
    r = readiness(f32([top, above, last_kept, clamped, -far, 1.0]), recipe, tensor_amax=top)
    assert r["saturated"] == 2
    assert r["sq_error"] == sum((v - top) ** 2 for v in (above, last_kept, clamped, far))
    assert readiness(f32([top, 1.0]), recipe, tensor_amax=top)["saturated"] == 0
    assert readiness(f32([above, last_kept]), recipe, tensor_amax=top)["saturated"] == 0


@pytest.mark.parametrize(
    ("recipe", "top"), [("mxfp8_e4m3", 448.0), ("mxfp8_e5m2", 57344.0), ("mxfp4", 6.0), ("nvfp4", 6.0)]
)
def test_block_amax_at_the_element_max_and_just_above(recipe, top):
    """A block whose amax scales exactly onto max_E (MX: amax = max_E * 2^-3, X = -3; NVFP4: d = 1, amax_b = 6,
    s_b = 1) loses nothing; the next float32 above it scales to just above max_E (the same X, or the same s_b
    = cast_E4M3(1.0000001) = 1): not saturated (it rounds to the max), dequantized to the max. MX: a block
    amax at 2^-3 times the first value the cast clamps keeps X = -3 and is saturated, the float32 below it not
    (NVFP4's s_b follows the block amax, so no block amax reaches 7 there)."""
    scale = 1.0 if recipe == "nvfp4" else 2.0**-3
    at = top * scale
    above = float(np.nextafter(np.float32(at), np.float32(INF)))
    given = 2688.0 if recipe == "nvfp4" else None
    kept = readiness(f32([at, at / 2]), recipe, tensor_amax=given)
    assert kept["saturated"] == 0 and kept["sq_error"] == 0.0
    pushed = readiness(f32([above, at / 2]), recipe, tensor_amax=given)
    assert pushed["saturated"] == 0 and pushed["sq_error"] == (above - at) ** 2
    if recipe == "nvfp4":
        return
    clamped = READINESS_CLAMPED_FROM[RECIPES_BY_NAME[recipe].element] * scale
    last_kept = float(np.nextafter(np.float32(clamped), np.float32(0.0)))
    assert readiness(f32([clamped, at / 2]), recipe)["saturated"] == 1
    assert readiness(f32([last_kept, at / 2]), recipe)["saturated"] == 0


def test_fp8_tensor_hand_computed():
    """amax 448: s = 1, so each element is its own E4M3 cast: 1.0625 -> 1 (tie to even), 17 -> 16 (spacing 2
    at 16..32: 17 is a tie, to 16), 0.0009 (below the tie 2^-10) -> 0 (flushed), -3 exact."""
    x = f32([448.0, 1.0625, 17.0, 0.0009, -3.0])
    r = readiness(x, "fp8_e4m3_tensor")
    expected = [448.0, 1.0, 16.0, 0.0, -3.0]
    sq = sum((float(a) - b) ** 2 for a, b in zip(x, expected, strict=True))
    assert (
        r["sq_error"] == pytest.approx(sq, rel=1e-15) and r["flushed"] == 1 and r["saturated"] == 0 and r["blocks"] == 1
    )


def test_fp8_tensor_scale_rounding_can_push_the_amax_just_above_max():
    """s = fl32(448 / amax) may round up, so that fl32(amax * s) is the float32 just above 448: the cast rounds
    it back to 448, and it is not counted as saturated (what it loses is the scale's rounding, in sq_error).
    Which amax does it is computed here in numpy's float32; both kinds occur among these."""
    above = set()
    for amax in (3.0, 5.0, 7.0, 11.0, 13.0, 17.0, 19.0, 23.0, 29.0, 31.0):
        v = np.float32(amax) * (np.float32(448.0) / np.float32(amax))
        r = readiness(f32([amax, 1.0]), "fp8_e4m3_tensor")
        assert r["saturated"] == 0, amax
        above.add(bool(v > 448.0))
    assert above == {False, True}


def test_fp32_scale_overflows_to_flt_max():
    """A block amax below 448 / FLT_MAX: fl32(448 / amax) is +inf, the scale is FLT_MAX and counted in
    scale_flushed. 2^-149 * FLT_MAX ~ 2^-22 is below E4M3's 2^-10: flushed. 2^-137 * FLT_MAX = (1 - 2^-24)
    2^-9 rounds to 2^-9, kept (dequantized 2^-9 / FLT_MAX, not 0)."""
    tiny = f32([2.0**-149, 0.0])
    r = readiness(tiny, "fp8_e4m3_block128")
    assert r["scale_flushed"] == 1 and r["flushed"] == 1 and r["sq_error"] == 2.0**-298
    kept = readiness(f32([2.0**-137]), "fp8_e4m3_block128")
    assert kept["scale_flushed"] == 1 and kept["flushed"] == 0
    assert kept["sq_error"] == (2.0**-137 - 2.0**-9 / FLT_MAX) ** 2
    # a normal float32 amax overflows the scale too (448 * 2^120 > FLT_MAX); 2^-100 does not
    assert readiness(f32([2.0**-120]), "fp8_e4m3_tensor")["scale_flushed"] == 1
    assert readiness(f32([2.0**-100]), "fp8_e4m3_tensor")["scale_flushed"] == 0


def test_block128_blocks_have_their_own_scales():
    """Two 1x128 blocks with amax 448 and 448 / 1024: each is scaled to its own max, so both lose nothing on
    grid values (a tensor scale would flush the small block's 2^-18)."""
    x = torch.full((256,), 1.0)
    x[:128] = 448.0
    x[128:] = 448.0 / 1024
    x[200] = 2.0**-18  # scaled by its block's 1024: 2^-8, an E4M3 subnormal; by the tensor's 1: below 2^-10
    r = readiness(x, "fp8_e4m3_block128")
    assert r["blocks"] == 2 and r["sq_error"] == 0.0 and r["flushed"] == 0
    assert readiness(x, "fp8_e4m3_tensor")["flushed"] == 1


@pytest.mark.parametrize(("recipe", "emax"), [("mxfp8_e4m3", 8), ("mxfp8_e5m2", 15), ("mxfp4", 2)])
def test_mx_floor_power_of_two_amax(recipe, emax):
    """amax = 2^5: X = log2(amax) - emax exactly, so the amax lands on 2^emax, the grid's top binade, and
    every grid value times 2^X comes back exact."""
    fmt = RECIPES_BY_NAME[recipe].element_format
    scale = 2.0 ** (5 - emax)
    on_grid = [1.0, 1.5, 2.0, -3.0, fmt.min_subnormal, 2.0**emax] if fmt.name != "e2m1" else [0.5, 1.5, 3.0, 4.0]
    x = f32([v * scale for v in on_grid] + [32.0])
    r = readiness(x, recipe)
    assert r["sq_error"] == 0.0 and r["saturated"] == 0 and r["flushed"] == 0
    # half the smallest subnormal of the scaled grid is a tie to zero: flushed
    half = f32([32.0, fmt.min_subnormal * scale / 2])
    assert readiness(half, recipe)["flushed"] == 1


def test_mx_floor_amax_below_a_power_of_two_saturates_and_rceil_does_not():
    """The OCP floor rule: amax = 31.75 (1.984 * 2^4) gives X = 4 - 8 = -4, so v = 31.75 * 16 = 508 > 448:
    saturated to 448, dequantized 28. RCEIL: r = 31.75 / 448, X = ceil(log2 r) = -3, v = 254: kept, and
    254 rounds to 256 on E4M3 (spacing 16 at 128..256; 254 is nearer 256), dequantized 32."""
    x = f32([31.75, 1.0])
    floor = readiness(x, "mxfp8_e4m3")
    assert floor["saturated"] == 1 and floor["sq_error"] == (31.75 - 28.0) ** 2
    rceil = readiness(x, "mxfp8_e4m3_rceil")
    assert rceil["saturated"] == 0 and rceil["sq_error"] == (31.75 - 32.0) ** 2
    # mxfp4 floor: amax 7 -> X = 0, v = 7 > 6 saturates to 6
    assert readiness(f32([7.0]), "mxfp4")["saturated"] == 1


def test_mxfp8_hand_computed():
    """amax 100 = 1.5625 * 2^6: X = 6 - 8 = -2, v = 4x. 100 -> 400, halfway between E4M3's 384 and 416
    (spacing 32 at 256..512): to the even 384, dequantized 96; 0.3 -> 1.2 -> 1.25 (spacing 1/8), 0.3125;
    2^-12 -> 2^-10, half the smallest subnormal: 0, flushed; 7 -> 28 exact. RCEIL: r = fl32(100 / 448),
    X = ceil(log2 r) = -2 as well (2^-3 < r <= 2^-2): the same numbers."""
    x = f32([100.0, 0.3, 2.0**-12, 7.0])
    x32 = [float(v) for v in x]
    expected = (x32[0] - 96.0) ** 2 + (x32[1] - 0.3125) ** 2 + x32[2] ** 2
    for recipe in ("mxfp8_e4m3", "mxfp8_e4m3_rceil"):
        r = readiness(x, recipe)
        assert r["sq_error"] == pytest.approx(expected, rel=1e-15) and r["flushed"] == 1 and r["saturated"] == 0


def test_rceil_power_of_two_ratio_is_exact():
    """amax = 448 * 2^-4 = 28: r = 2^-4 exactly, X = -4 (not rounded up past it), v = 448: not saturated."""
    r = readiness(f32([28.0, 1.75]), "mxfp8_e4m3_rceil")
    assert r["saturated"] == 0 and r["sq_error"] == 0.0


def _least_power_at_or_above(r: np.ndarray) -> np.ndarray:
    """X = the least integer with 2^X >= r (r > 0), clamped to E8M0's [-127, 127]; -127 where r = 0."""
    mantissa, exponent = np.frexp(r.astype(np.float64))
    x = np.where(mantissa == 0.5, exponent - 1, exponent)
    return np.where(r == 0, -127, np.clip(x, -127, 127))


@pytest.mark.parametrize("fmt_name", ["e4m3", "e5m2"])
def test_rceil_division_gives_the_exponent_te_and_torchao_get(fmt_name):
    """TransformerEngine (amax * max_norm_rcp) and torchao's RCEIL (max_abs * (1.0 / max_pos)) multiply by
    the float32 reciprocal; the rule divides, fl32(amax / max_E). The two r differ in the last bit for about
    half of all amax, never in the X they give: every float32 of the binade [256, 512) (r normal: by scaling,
    every normal r), and the float32 near max_E * 2^-j where r is an fp32 subnormal or 0."""
    max_e = np.float32(ELEMENT_FORMATS[fmt_name].max_value)
    reciprocal = np.float32(1.0) / max_e
    binade = (np.arange(1 << 23, dtype=np.int64) + 0x43800000).astype(np.int32).view(np.float32)
    near = [
        (np.arange(-2000, 2000) + np.float32(max_e * 2.0**-j).view(np.int32)).astype(np.int32).view(np.float32)
        for j in range(120, 166)
        if np.float32(max_e * 2.0**-j) > 0
    ]
    amax = np.concatenate([binade, *near])
    amax = amax[amax > 0]
    divided, multiplied = amax / max_e, amax * reciprocal
    assert (divided != multiplied).mean() > 0.3  # the r really differ
    assert np.array_equal(_least_power_at_or_above(divided), _least_power_at_or_above(multiplied))


def test_e8m0_clamped_at_its_smallest_exponent():
    """amax_b = 2^-130 (a float32 subnormal): the OCP X = -130 - 8 = -138 is clamped to -127 (scale_flushed),
    yet v = 2^-130 * 2^127 = 2^-3 is exact on E4M3: nothing lost. 2^-149 gives v = 2^-22: flushed. RCEIL:
    r = fl32(2^-149 / 448) = 0: X = -127, clamped too (scale_flushed)."""
    kept = readiness(f32([2.0**-130]), "mxfp8_e4m3")
    assert kept["scale_flushed"] == 1 and kept["flushed"] == 0 and kept["sq_error"] == 0.0
    for recipe in ("mxfp8_e4m3", "mxfp8_e5m2", "mxfp4", "mxfp8_e4m3_rceil"):
        lost = readiness(f32([2.0**-149]), recipe)
        assert lost["scale_flushed"] == 1 and lost["flushed"] == 1 and lost["sq_error"] == 2.0**-298, recipe
    # an ordinary block clamps nothing
    assert readiness(f32([1.0, 2.0]), "mxfp8_e4m3_rceil")["scale_flushed"] == 0


def test_mxfp4_hand_computed():
    """amax 6: X = floor(log2 6) - 2 = 0, the scale is 1, so each element is its E2M1 cast: 1 -> 1,
    1.25 -> 1 (tie, even), 2.5 -> 2 (tie), 5 -> 4 (tie), 0.25 -> 0 (tie, flushed), 0.75 -> 1 (tie, even),
    3.5 -> 4 (tie), 0.2 -> 0 (flushed), -2.9 -> -3, 1.5 -> 1.5."""
    x = [1.0, 1.25, 2.5, 5.0, 6.0, 0.25, 0.75, 3.5, 0.2, -2.9, 1.5]
    dequantized = [1.0, 1.0, 2.0, 4.0, 6.0, 0.0, 1.0, 4.0, 0.0, -3.0, 1.5]  # with X = 1, 1.5 would give 2
    r = readiness(f32(x), "mxfp4")
    x32 = [float(v) for v in f32(x)]
    assert r["sq_error"] == pytest.approx(sum((a - b) ** 2 for a, b in zip(x32, dequantized, strict=True)), rel=1e-15)
    assert r["flushed"] == 2 and r["saturated"] == 0 and r["blocks"] == 1
    # amax 3: X = 1 - 2 = -1, v = 2x: [1, 1.25, 3] -> v [2, 2.5, 6] -> [2, 2, 6] -> dequantized [1, 1, 3]
    assert readiness(f32([1.0, 1.25, 3.0]), "mxfp4")["sq_error"] == 0.25**2


@pytest.mark.parametrize(
    "recipe", ["mxfp8_e4m3", "mxfp8_e5m2", "mxfp8_e4m3_rceil", "mxfp4", "nvfp4", "fp8_e4m3_block128"]
)
def test_short_last_block_is_its_own_block(recipe):
    """[3, 40]: each row is ceil(40 / B) blocks, the short last one scaled by its own amax: the tensor's
    numbers are the sums of its rows' and, row by row, of the full blocks' and the short block's."""
    block = RECIPES_BY_NAME[recipe].block
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 40, generator=g) * torch.logspace(-3, 3, 40)  # the short block far from the first
    whole = readiness(x, recipe, tensor_amax=float(x.abs().max()))
    full = (40 // block) * block
    parts = [x[i : i + 1, :full] for i in range(3) if full] + [x[i : i + 1, full:] for i in range(3)]
    if recipe == "nvfp4":  # the tensor scale must stay the whole tensor's
        parts_r = [readiness(p, recipe, tensor_amax=float(x.abs().max())) for p in parts]
    else:
        parts_r = [readiness(p, recipe) for p in parts]
    assert whole["blocks"] == 3 * math.ceil(40 / block) == sum(p["blocks"] for p in parts_r)
    for key in ("flushed", "saturated", "scale_flushed", "nonzero"):
        assert whole[key] == sum(p[key] for p in parts_r), key
    assert whole["sq_error"] == pytest.approx(sum(p["sq_error"] for p in parts_r), rel=1e-12)


def nvfp4_tensor(blocks: list[list[float]]) -> torch.Tensor:
    """16-element NVFP4 blocks, each padded with zeros, behind a first block of amax 2688 (so that the tensor
    decode scale d = fl32(2688 / 2688) = 1 and a block's E4M3 scale is s_b = cast_E4M3(amax_b / 6))."""
    rows = [[2688.0] + [0.0] * 15] + [b + [0.0] * (16 - len(b)) for b in blocks]
    return f32(rows).reshape(-1)


def test_nvfp4_block_scale_normal_is_exact_on_grid():
    """d = 1; the block of amax 6 has s_b = 1, total 1: E2M1 values come back exact; the block of amax 2688
    has s_b = 448: 2688 / 448 = 6, exact."""
    r = readiness(nvfp4_tensor([[6.0, 0.5, -1.5, 3.0]]), "nvfp4")
    assert r["scale_flushed"] == 0 and r["sq_error"] == 0.0 and r["flushed"] == 0 and r["blocks"] == 2


def test_nvfp4_block_scale_goes_subnormal():
    """amax_b = 6 * 2^-8: s_b = 2^-8, an E4M3 subnormal (below 2^-6) but exact: counted in scale_flushed,
    its elements still come back (6 * 2^-8 -> 6, 2^-9 = 0.5 * 2^-8 -> 0.5). amax_b = 6 * 1.3 * 2^-9 gives
    s_b = cast(1.3 * 2^-9) = 2^-9 (the subnormal spacing is 2^-9): total 2^-9, v = 7.8 saturates to 6."""
    r = readiness(nvfp4_tensor([[6 * 2.0**-8, 2.0**-9]]), "nvfp4")
    assert r["scale_flushed"] == 1 and r["flushed"] == 0 and r["sq_error"] == 0.0
    coarse = 6 * 1.3 * 2.0**-9
    c = readiness(nvfp4_tensor([[coarse]]), "nvfp4")
    x32 = float(f32([coarse])[0])
    assert c["scale_flushed"] == 1 and c["saturated"] == 1 and c["sq_error"] == (x32 - 6 * 2.0**-9) ** 2


def test_nvfp4_block_scale_flushes_to_zero():
    """amax_b = 6 * 2^-10: s_b = cast(2^-10), half E4M3's smallest subnormal, a tie to 0: the scale is 0,
    every element of the block dequantizes to 0 (flushed), scale_flushed 1; just above (the next float32)
    rounds up to 2^-9 and the element is kept."""
    block = [6 * 2.0**-10, 2.0**-12, -(2.0**-11)]
    r = readiness(nvfp4_tensor([block]), "nvfp4")
    x32 = [float(v) for v in f32(block)]
    assert r["scale_flushed"] == 1 and r["flushed"] == 3 and r["saturated"] == 0
    assert r["sq_error"] == sum(v * v for v in x32)
    above = float(np.nextafter(np.float32(6 * 2.0**-10), np.float32(1)))
    kept = readiness(nvfp4_tensor([[above]]), "nvfp4")
    assert kept["scale_flushed"] == 1 and kept["flushed"] == 0


def test_nvfp4_tensor_of_zeros_and_tiny_tensor_amax():
    """amax_t = 0: nothing to lose. amax_t = 2^-140: d = fl32(2^-140 / 2688) = 0, so s_b = cast(+inf) = 448
    (a normal scale: not counted) but total = 0 and the element flushes. amax_t = 2^-149: also
    fl32(amax_b / 6) = 0, so s_b = 0 (not 0/0): scale_flushed."""
    zero = readiness(torch.zeros(32), "nvfp4")
    assert zero["flushed"] == 0 and zero["sq_error"] == 0.0 and zero["scale_flushed"] == 0
    tiny = readiness(f32([2.0**-140]), "nvfp4")
    assert tiny["flushed"] == 1 and tiny["scale_flushed"] == 0 and tiny["sq_error"] == 2.0**-280
    tiniest = readiness(f32([2.0**-149]), "nvfp4")
    assert tiniest["flushed"] == 1 and tiniest["scale_flushed"] == 1 and tiniest["sq_error"] == 2.0**-298


def test_nvfp4_hand_computed_two_level():
    """amax_t = 2688 (d = 1); a block of amax 3: s_b = cast_E4M3(0.5) = 0.5, total 0.5, v = 2x:
    [3, 1.2, -0.7] -> v [6, 2.4, -1.4] -> q [6, 2, -1.5] -> dequantized [3, 1, -0.75]."""
    block = [3.0, 1.2, -0.7]
    r = readiness(nvfp4_tensor([block]), "nvfp4")
    x32 = [float(v) for v in f32(block)]
    expected = (x32[1] - 1.0) ** 2 + (x32[2] + 0.75) ** 2
    assert r["sq_error"] == pytest.approx(expected, rel=1e-15) and r["flushed"] == 0 and r["saturated"] == 0


def test_bf16_and_fp16_are_their_float32_values():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 48, generator=g) * 10
    for dtype in (torch.bfloat16, torch.float16):
        narrow = x.to(dtype)
        a = format_readiness_reference([narrow], range(len(RECIPES)))
        b = format_readiness_reference([narrow.float()], range(len(RECIPES)))
        for got, expected in zip(a, b, strict=True):
            assert torch.equal(got, expected)


# ---------------------------------------------------------------------------------------------------------
# a second implementation of every recipe, on torch's float8 casts and the E2M1 table, on random tensors


def e2m1_cast(v: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(e2m1_by_hand(v.double().numpy()))


def oracle_cast(v: torch.Tensor, fmt_name: str) -> torch.Tensor:
    """v (float32 values) cast to the element format without cast_element: torch's float8 casts of v clamped to
    the max (saturation), or the E2M1 table; float64."""
    if fmt_name == "e2m1":
        return e2m1_cast(v)
    top = ELEMENT_FORMATS[fmt_name].max_value
    return v.float().clamp(-top, top).to(TORCH_FLOAT8[fmt_name]).double()


def oracle_readiness(x: torch.Tensor, recipe_name: str) -> dict[str, float]:
    """The rule of one recipe on a 2-d float32 tensor, written again with different arithmetic: torch.frexp and
    torch.log2 for the exponents, float8 casts for the elements, one Python loop over rows and blocks."""
    recipe = RECIPES_BY_NAME[recipe_name]
    fmt = recipe.element_format
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros_like(x))
    amax_t = xf.abs().max().reshape(1) if x.numel() else torch.zeros(1)
    out = {"flushed": 0, "saturated": 0, "scale_flushed": 0, "sq_error": 0.0, "blocks": 0}
    width = recipe.block or x.shape[1]
    pieces = (
        [xf.reshape(1, -1)]
        if recipe.block == 0
        else [xf[i : i + 1, j : j + width] for i in range(x.shape[0]) for j in range(0, x.shape[1], width)]
    )
    masks = (
        [finite.reshape(1, -1)]
        if recipe.block == 0
        else [finite[i : i + 1, j : j + width] for i in range(x.shape[0]) for j in range(0, x.shape[1], width)]
    )
    for b, ok in zip(pieces, masks, strict=True):
        b, ok = b.reshape(-1), ok.reshape(-1)
        amax = b.abs().max().reshape(1)
        v = None
        if recipe.scale in ("fp32_tensor", "fp32_block"):
            a = amax_t if recipe.scale == "fp32_tensor" else amax
            s = torch.tensor([fmt.max_value], dtype=torch.float32) / a
            flushed_scale = bool(torch.isinf(s)) and a.item() != 0
            s = torch.tensor([1.0]) if a.item() == 0 else (torch.tensor([FLT_MAX]) if flushed_scale else s)
            v = b * s
            deq = oracle_cast(v, fmt.name) / s.double()
        elif recipe.scale in ("e8m0_floor", "e8m0_rceil"):
            if recipe.scale == "e8m0_floor":
                zero = amax.item() == 0
                wanted = int(torch.frexp(amax.double())[1].item()) - 1 - fmt.emax if not zero else -127
            else:
                r = amax / torch.tensor([fmt.max_value], dtype=torch.float32)
                zero = r.item() == 0
                wanted = math.ceil(torch.log2(r.double()).item()) if not zero else -1000
            X = min(max(wanted, -127), 127)
            flushed_scale = amax.item() > 0 and wanted != X
            v = (b.double() * 2.0**-X).float()  # exact: v is a float32 value
            deq = oracle_cast(v, fmt.name) * 2.0**X
        else:  # nvfp4
            d = amax_t / torch.tensor([2688.0])
            d = torch.ones(1) if amax_t.item() == 0 else d
            per = amax / torch.tensor([6.0])
            wanted = per / d if per.item() != 0 else torch.zeros(1)
            s_b = oracle_cast(wanted.clamp(max=FLT_MAX), "e4m3").float()  # +inf saturates to 448 either way
            total = d * s_b
            flushed_scale = amax.item() > 0 and s_b.item() < 2.0**-6
            if total.item() == 0:
                deq = torch.zeros_like(b, dtype=torch.float64)
            else:
                v = b / total
                deq = e2m1_cast(v) * total.double()
        out["blocks"] += 1
        out["scale_flushed"] += int(flushed_scale)
        out["flushed"] += int((ok & (b != 0) & (deq == 0)).sum())
        if v is not None:
            out["saturated"] += int((ok & clamped_by_cast(v, fmt.name)).sum())
        out["sq_error"] += float(torch.where(ok, b.double() - deq, torch.zeros_like(deq)).square().sum())
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(RECIPE_NAMES),
    st.integers(1, 3),
    st.integers(1, 150),
    st.integers(0, 2**31 - 1),
    st.sampled_from([1e-44, 1e-40, 1e-30, 1e-6, 1.0, 3e4, 1e36, 3e38, "bits"]),
)
def test_second_implementation_agrees_on_random_tensors(recipe, rows, last, seed, magnitude):
    """Spread over many binades (so blocks flush, saturate and clamp), a NaN and an Inf sprinkled in, or random
    float32 bit patterns: the counts agree exactly, sq_error to float64 summation order."""
    g = torch.Generator().manual_seed(seed)
    if magnitude == "bits":
        x = torch.randint(-(2**31), 2**31 - 1, (rows, last), generator=g, dtype=torch.int64)
        x = x.to(torch.int32).view(torch.float32)
    else:
        x = (
            torch.randn(rows, last, generator=g, dtype=torch.float64)
            * magnitude
            * torch.logspace(-8, 8, last, dtype=torch.float64)[torch.randperm(last, generator=g)]
        ).float()
    if x.numel() > 3:
        x.view(-1)[seed % x.numel()] = NAN
        x.view(-1)[(seed // 7) % x.numel()] = INF
    got = readiness(x, recipe)
    expected = oracle_readiness(x, recipe)
    for key in ("flushed", "saturated", "scale_flushed", "blocks"):
        assert got[key] == expected[key], (key, got, expected)
    assert got["sq_error"] == pytest.approx(expected["sq_error"], rel=1e-12, abs=1e-300)


# ---------------------------------------------------------------------------------------------------------
# invariants


@st.composite
def tensors_from_bits(draw):
    rows = draw(st.integers(0, 3))
    last = draw(st.integers(1, 70))
    kind = draw(st.sampled_from(["bits", "normal"]))
    n = rows * last
    if kind == "bits":
        bits = draw(st.lists(st.integers(0, 2**32 - 1), min_size=n, max_size=n))
        x = torch.from_numpy(np.array(bits, dtype=np.uint32).view(np.float32).copy())
    else:
        seed = draw(st.integers(0, 2**31 - 1))
        x = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * draw(st.sampled_from([1e-30, 1e-3, 1, 1e4]))
    return x.reshape(rows, last)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tensors_from_bits())
def test_invariants_on_random_bit_patterns(x):
    counts, sums, amax = format_readiness_reference([x], range(len(RECIPES)))
    numel, nonzero, nonfinite = counts[0, :3].tolist()
    finite = torch.isfinite(x)
    assert numel == x.numel() and nonfinite == int((~finite).sum()) and nonzero == int((finite & (x != 0)).sum())
    assert amax[0].item() == (x[finite].abs().max().item() if finite.any() else 0.0)
    for r, recipe in enumerate(RECIPES):
        flushed, saturated, blocks, scale_flushed = counts[0, 3 + 4 * r : 7 + 4 * r].tolist()
        expected_blocks = (
            (1 if x.numel() else 0) if recipe.block == 0 else x.shape[0] * math.ceil(x.shape[1] / recipe.block)
        )
        assert blocks == expected_blocks, recipe.name
        assert 0 <= flushed <= nonzero and 0 <= saturated <= numel - nonfinite and 0 <= scale_flushed <= blocks
        error = sums[0, 1 + r].item()
        assert error >= 0 and math.isfinite(error), recipe.name
        # negating the tensor changes nothing
    negated = format_readiness_reference([-x], range(len(RECIPES)))
    assert torch.equal(negated[0], counts) and torch.equal(negated[1], sums)


GRID_CASES = {
    # recipe: (grid values, the amax each block holds so that the scale is exactly 1, tensor amax)
    "fp8_e4m3_tensor": ("e4m3", 448.0, None),
    "fp8_e5m2_tensor": ("e5m2", 57344.0, None),
    "fp8_e4m3_block128": ("e4m3", 448.0, None),
    "mxfp8_e4m3": ("e4m3", 256.0, None),  # floor(log2 256) - 8 = 0
    "mxfp8_e5m2": ("e5m2", 32768.0, None),
    "mxfp8_e4m3_rceil": ("e4m3", 448.0, None),  # r = 1
    "mxfp4": ("e2m1", 4.0, None),
    "nvfp4": ("e2m1", 6.0, 2688.0),  # d = 1, s_b = 1
}


def grid_values(fmt_name: str) -> torch.Tensor:
    if fmt_name == "e2m1":
        g = torch.tensor(E2M1_GRID)
    else:
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(TORCH_FLOAT8[fmt_name]).float()
        g = codes[torch.isfinite(codes)]
    return torch.cat([g, -g]).float()


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(RECIPE_NAMES), st.integers(1, 3), st.integers(1, 300), st.integers(0, 2**31 - 1))
def test_grid_values_with_scale_one_lose_nothing(recipe, rows, last, seed):
    fmt_name, anchor, tensor_amax = GRID_CASES[recipe]
    grid = grid_values(fmt_name)
    g = torch.Generator().manual_seed(seed)
    x = grid[torch.randint(len(grid), (rows, last), generator=g)]
    block = RECIPES_BY_NAME[recipe].block or last
    x[:, ::block] = anchor  # every block (and the tensor) holds the anchor amax
    big = x.abs() > anchor  # a grid value above the anchor would move the scale
    x[big] = torch.sign(x[big]) * anchor
    r = readiness(x, recipe, tensor_amax)
    assert r["sq_error"] == 0.0 and r["saturated"] == 0 and r["scale_flushed"] == 0, recipe
    assert r["flushed"] == 0


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(RECIPE_NAMES), st.integers(-20, 20), st.integers(0, 2**31 - 1))
def test_scaling_by_a_power_of_two_changes_only_the_error_scale(recipe, k, seed):
    """Every rule is relative to the amax: x * 2^k (kept well inside float32's normal range) gives the same
    counts and sq_error * 4^k exactly."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 50, generator=g) * torch.logspace(-2, 2, 50)
    a = format_readiness_reference([x], [RECIPE_NAMES.index(recipe)])
    b = format_readiness_reference([x * 2.0**k], [RECIPE_NAMES.index(recipe)])
    assert torch.equal(a[0], b[0])
    assert torch.equal(a[1] * 4.0**k, b[1])
