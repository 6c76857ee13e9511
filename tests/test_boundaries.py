"""Every format boundary of docs/numerics.md, with its nextafter neighbours on both sides and both signs,
judged element by element (each value in its own tensor) against the oracles of tests/oracles.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import amp_inspect
from tests import oracles
from tests.oracles import ALL_FORMATS, SPECS

# ---------------------------------------------------------------------------------------------------------
# the boundaries, from the format parameters (not from amp_inspect's tables)


def boundaries(fmt: str) -> dict[str, float]:
    s = SPECS[fmt]
    emin, m = s.min_normal_exponent, s.mantissa_bits
    b = {
        "max_finite": s.max_finite,
        "min_normal": s.min_normal,
        "subnormal_normal_tie": math.ldexp(1.0, emin) - math.ldexp(1.0, emin - m - 1),
        "max_subnormal": math.ldexp(1.0, emin) - math.ldexp(1.0, emin - m),
        "zero_threshold": math.ldexp(1.0, emin - m - 1),
        "min_subnormal": s.min_subnormal,
        "min_subnormal_tie": 1.5 * s.min_subnormal,  # between 1 and 2 subnormal steps: rounds to even, 2
        "two_subnormals": 2 * s.min_subnormal,
        "one": 1.0,
    }
    if s.has_inf:
        max_exponent = math.frexp(s.max_finite)[1] - 1
        b["overflow_threshold"] = math.ldexp(2.0 - math.ldexp(1.0, -m - 1), max_exponent)
    else:
        b["overflow_threshold"] = oracles.E4M3_OUT_OF_RANGE_ABOVE  # 464: ties to 448; above it is out of range
        b["first_absent"] = 480.0
    return b


# The table of docs/numerics.md, float32 bits of |x|: (max finite, overflows from, min normal,
# subnormal below, zero at and below). e4m3's "overflows" is "> 464", so the first float32 above 464.
NUMERICS_MD = {
    "fp16": (0x477FE000, 0x477FF000, 0x38800000, 0x387FE000, 0x33000000),
    "bf16": (0x7F7F0000, 0x7F7F8000, 0x00800000, 0x007F8000, 0x00008000),
    "fp8_e4m3": (0x43E00000, 0x43E80001, 0x3C800000, 0x3C700000, 0x3A800000),
    "fp8_e5m2": (0x47600000, 0x47700000, 0x38800000, 0x38600000, 0x37000000),
}


def _f32(bits: int) -> float:
    return float(oracles.f32_from_bits([bits])[0])


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_numerics_md_table_agrees_with_exact_rounding(fmt):
    """The documented thresholds are where the exact classifier changes category (guards the oracle and
    the document against each other)."""
    max_finite, overflow_from, min_normal, normal_from, zero_upto = NUMERICS_MD[fmt]
    assert _f32(max_finite) == SPECS[fmt].max_finite
    assert _f32(min_normal) == SPECS[fmt].min_normal
    c = oracles.classify_exact_scalar
    assert c(_f32(overflow_from), fmt) == "overflow"
    assert c(_f32(overflow_from - 1), fmt) == "normal"
    assert c(_f32(normal_from), fmt) == "normal"
    assert c(_f32(normal_from - 1), fmt) == "subnormal"
    assert c(_f32(zero_upto), fmt) == "underflow"
    assert c(_f32(zero_upto + 1), fmt) == "subnormal"


def _neighbours32(values, steps=2) -> np.ndarray:
    out = []
    for b in values:
        x = np.float32(b)
        assert float(x) == b, f"{b} is not a float32"
        down = up = x
        out.append(x)
        for _ in range(steps):
            down = np.nextafter(down, np.float32(-np.inf))
            up = np.nextafter(up, np.float32(np.inf))
            out.extend([down, up])
    arr = np.array(out, dtype=np.float32)
    return np.concatenate([arr, -arr])


@np.errstate(over="ignore")
def _neighbours64(values, steps=2) -> np.ndarray:
    out = []
    for b in values:
        x = np.float64(b)
        down = up = x
        out.append(x)
        for _ in range(steps):
            down = np.nextafter(down, -np.inf)
            up = np.nextafter(up, np.inf)
            out.extend([down, up])
        out.extend([x * (1 - 2.0**-40), x * (1 + 2.0**-40)])
    arr = np.array(out, dtype=np.float64)
    return np.concatenate([arr, -arr])


ALL_BOUNDARIES = sorted({v for f in ALL_FORMATS for v in boundaries(f).values()})
SPECIALS32 = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 2.0**-149, 2.0**-126, 3.4028234663852886e38])


def assert_per_element(stats, v: np.ndarray, what: str) -> None:
    """``stats`` of one-element tensors whose judged values are v, checked element by element."""
    v = np.asarray(v)
    formats = stats.formats
    exp = oracles.per_element_expected(v, formats)
    finite = np.isfinite(v)
    got = {c: getattr(stats, c).numpy() for c in oracles.CATEGORIES}
    for c in oracles.CATEGORIES:
        bad = np.nonzero((got[c] != exp[c]).any(axis=1))[0]
        if bad.size:
            rows = [
                f"{v[i]!r} (bits {v[i : i + 1].view(np.uint32 if v.dtype == np.float32 else np.uint64)[0]:#x}): "
                f"got {got[c][i].tolist()} want {exp[c][i].tolist()}"
                for i in bad[:10]
            ]
            raise AssertionError(f"{what}: {c} {formats} mismatch on {bad.size} values:\n" + "\n".join(rows))
    np.testing.assert_array_equal(stats.numel.numpy(), 1)
    np.testing.assert_array_equal(stats.nan.numpy(), np.isnan(v))
    np.testing.assert_array_equal(stats.posinf.numpy(), np.isposinf(v))
    np.testing.assert_array_equal(stats.neginf.numpy(), np.isneginf(v))
    np.testing.assert_array_equal(stats.zero.numpy(), v == 0)
    mags = np.where(finite, np.abs(v), 0).astype(np.float64)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        want_amax = mags.astype(np.float32)
        want_amin = np.where(finite & (v != 0), mags, np.inf).astype(np.float32)
        want_sumsq = mags * mags
        bins = (v.astype(np.float32).view(np.uint32) >> np.uint32(23)) & np.uint32(0xFF)
    np.testing.assert_array_equal(stats.amax.numpy(), want_amax, err_msg=f"{what}: amax")
    np.testing.assert_array_equal(stats.amin_nonzero.numpy(), want_amin, err_msg=f"{what}: amin_nonzero")
    np.testing.assert_allclose(stats.sumsq.numpy(), want_sumsq, rtol=1e-12, err_msg=f"{what}: sumsq")
    want_hist = np.zeros((v.size, 256), dtype=np.int64)
    want_hist[np.arange(v.size), bins.astype(np.int64)] = 1
    np.testing.assert_array_equal(stats.hist.numpy(), want_hist, err_msg=f"{what}: hist")


def run_per_element(x: torch.Tensor, scale=None, formats=ALL_FORMATS):
    return amp_inspect.tensor_stats(list(x.reshape(-1).split(1)), scale=scale, formats=formats)


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("formats", [ALL_FORMATS, ("fp8_e5m2", "fp16"), ("fp8_e4m3",), ("bf16",)])
def test_float32_boundaries(formats):
    v = np.concatenate([_neighbours32(ALL_BOUNDARIES), SPECIALS32.astype(np.float32)])
    x = torch.from_numpy(v.copy())
    assert_per_element(run_per_element(x, formats=formats), v, f"float32 {formats}")


def test_float32_boundaries_in_one_tensor():
    """The same values in one tensor: the counts are the sums of the per-element classes."""
    v = _neighbours32(ALL_BOUNDARIES)
    x = torch.from_numpy(np.tile(v, 5))  # a few thousand elements: crosses the 2048-element inner block
    stats = amp_inspect.tensor_stats([x], formats=ALL_FORMATS)
    exp = oracles.per_element_expected(v, ALL_FORMATS)
    for c in oracles.CATEGORIES:
        np.testing.assert_array_equal(getattr(stats, c)[0].numpy(), 5 * exp[c].sum(axis=0), err_msg=c)


@pytest.mark.parametrize("scale", [2.0**16, 2.0**-16, 3.0, 0.1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scaled_boundaries(scale, dtype):
    """x chosen so that v = float32(x) * scale lands on and around each boundary."""
    s32 = float(np.float32(scale))
    base = []
    for b in ALL_BOUNDARIES:
        with np.errstate(over="ignore"):
            x = np.float32(b / s32)
        if not np.isfinite(x) or x == 0:
            continue
        base.extend([x, np.nextafter(x, np.float32(0)), np.nextafter(x, np.float32(np.inf))])
    x32 = np.array(base, dtype=np.float32)
    x32 = np.concatenate([x32, -x32, SPECIALS32.astype(np.float32)])
    x = torch.from_numpy(x32.copy()).to(dtype)
    v = oracles.judged_values(x, scale)
    # the selection worked: every boundary that fits is hit exactly by some v
    hits = set(np.abs(v[np.isfinite(v)]).astype(np.float64).tolist())
    assert sum(b in hits for b in ALL_BOUNDARIES) >= len(ALL_BOUNDARIES) - 6
    assert_per_element(run_per_element(x, scale=scale), v, f"{dtype} scale {scale}")


def test_scaled_boundaries_with_tensor_scale():
    scale = torch.tensor(2.0**-10)
    v0 = _neighbours32([b for b in ALL_BOUNDARIES if b * 2.0**10 < 3e38])
    x = torch.from_numpy((v0.astype(np.float64) * 2.0**10).astype(np.float32))
    v = oracles.judged_values(x, 2.0**-10)
    np.testing.assert_array_equal(v, v0)  # the scale by a power of two is exact here
    assert_per_element(run_per_element(x, scale=scale), v, "float32 tensor scale 2^-10")


def test_float64_boundaries():
    """float64 inputs are judged on their exact value: neighbours that float32 would round onto a boundary
    must land on the side their exact value is on."""
    beyond32 = [3.4028234663852886e38, 3.4028235677973366e38, 1e39, 1e300, 1.7976931348623157e308]
    tiny = [2.0**-149, 2.0**-150, 1e-46, 1e-300, 5e-324, 2.2250738585072014e-308]
    v = np.concatenate([_neighbours64(ALL_BOUNDARIES + beyond32 + tiny), [0.0, -0.0, np.inf, -np.inf, np.nan]])
    x = torch.from_numpy(v.copy())
    assert_per_element(run_per_element(x), v, "float64")


def test_float64_neighbours_differ_from_float32_rounding():
    """A sanity check of the test itself: some float64 neighbours are classified differently from their
    float32 roundings, so the float64 test above would catch a kernel that rounds through float32."""
    v = _neighbours64(ALL_BOUNDARIES)
    differs = 0
    for f in ALL_FORMATS:
        exact = oracles.classify_exact(v, f)
        via32 = oracles.classify_exact(v.astype(np.float32).astype(np.float64), f)
        differs += sum(int((exact[c] != via32[c]).sum()) for c in oracles.CATEGORIES)
    assert differs > 20


@pytest.mark.parametrize("scale", [None, 2.0**16, 3.0, 2.0**-20])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_all_16_bit_patterns(dtype, scale):
    """Every float16 and bfloat16 value (all 65536 bit patterns, so every representable neighbour of every
    boundary), each in its own tensor."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    x = bits.view(dtype)
    v = oracles.judged_values(x, scale)
    stats = run_per_element(x, scale=scale)
    assert_per_element(stats, v, f"{dtype} scale {scale}")
    # and the exact classifier agrees for the formats that matter most here
    for f in ALL_FORMATS:
        exp = oracles.classify(v, f, exact=True)
        col = stats.column(f)
        for c in oracles.CATEGORIES:
            np.testing.assert_array_equal(getattr(stats, c)[:, col].numpy(), exp[c])


def test_float32_subnormal_inputs():
    """float32 subnormals (bin 0) across their whole range, both signs: the kernels compare bits, so no
    flush-to-zero can turn them into zeros."""
    bits = np.unique(np.concatenate([np.arange(1, 64), 2 ** np.arange(0, 23), (2 ** np.arange(1, 24)) - 1]))
    v = oracles.f32_from_bits(bits.astype(np.uint32))
    v = np.concatenate([v, -v])
    stats = run_per_element(torch.from_numpy(v.copy()))
    assert_per_element(stats, v, "float32 subnormals")
    assert int(stats.zero.sum()) == 0
    assert int(stats.hist[:, 0].sum()) == v.size


# ---------------------------------------------------------------------------------------------------------
# bounds inside blocks: the CPU kernel decides per 2048-element block which bounds need a per-element test
# (those between the block's smallest and largest magnitude) and counts the others from those extremes.

BLOCK = 2048
# Where the probe sits in its block: the first and last lanes of vectors of 16 and of 64, the middle, the end.
PROBE_POSITIONS = (0, 1, 15, 16, 63, 64, 1000, BLOCK - 1)


def _bound_probes(dtype: torch.dtype) -> np.ndarray:
    """Every boundary and its float32 neighbours as ``dtype`` holds them, and for 16-bit dtypes the two
    representable neighbours on each side of those: finite, nonzero, both signs."""
    v = _neighbours32(ALL_BOUNDARIES)
    held = torch.from_numpy(v.copy()).to(dtype)
    if dtype != torch.float32:
        bits = held.view(torch.int16).to(torch.int32)
        steps = torch.arange(-2, 3, dtype=torch.int32)
        held = (bits[:, None] + steps[None, :]).reshape(-1).clamp(-(2**15), 2**15 - 1).to(torch.int16).view(dtype)
    probes = oracles.input_as_numpy(held)
    return np.unique(probes[np.isfinite(probes) & (probes != 0)])


def _blocks_around(probe: float, dtype: torch.dtype, rng: np.random.Generator) -> torch.Tensor:
    """Blocks of BLOCK elements, each with the probe at one of PROBE_POSITIONS and every other element far
    from it (64x) on both sides, only above, or only below (so the probe is inside, the smallest or the
    largest of its block), random signs; then a short last block of 5 with the probe in it."""
    info = torch.finfo(dtype)
    mag = abs(probe)
    below, above = mag / 64, min(mag * 64, info.max)
    blocks = []
    for j, position in enumerate(PROBE_POSITIONS):
        side = j % 3  # 0: both sides, 1: all above, 2: all below
        others = (
            np.where(rng.random(BLOCK) < 0.5, below, above) if side == 0 else np.full(BLOCK, (above, below)[side - 1])
        )
        block = others * np.where(rng.random(BLOCK) < 0.5, -1.0, 1.0)
        block[position] = probe
        blocks.append(block)
    blocks.append(np.array([above, -below, probe, below, -above]))
    return torch.from_numpy(np.concatenate(blocks)).to(dtype)


@pytest.mark.parametrize("formats", [("fp16",), ("fp8_e5m2", "bf16"), ("bf16", "fp8_e4m3", "fp16"), ALL_FORMATS])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_each_bound_inside_outside_and_at_the_edge_of_a_block(dtype, formats):
    """One element on a bound (or a neighbour of it) per block, the block's other elements far on one or both
    sides: every count equals the oracle's, whichever way the block's extremes place the bound."""
    rng = np.random.default_rng(19)
    tensors = [_blocks_around(float(p), dtype, rng) for p in _bound_probes(dtype)]
    stats = amp_inspect.tensor_stats(tensors, formats=formats)
    oracles.assert_stats_match_oracle(stats, tensors, None, exact=False)
