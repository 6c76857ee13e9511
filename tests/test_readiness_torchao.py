"""Format readiness against torchao's own quantizers (torchao.prototype.mx_formats: ``to_mx`` for MXFP8 and MXFP4,
``nvfp4_quantize`` for NVFP4; torchao.float8's current scaling for the tensor-scaled FP8 recipes; the blockwise FP8
training's 1 x 128 activation quantizer; and the readiness hooks on torchao's Float8Linear), an oracle written by
other people: each tensor is quantized by torchao, its elements dequantized in float64 from torchao's scales and
element codes, and the counts that follow (flushed, saturated) must equal the op's exactly, the sum of squared
errors to 1e-12.

Where torchao's eager code and these rules part (docs/numerics.md says why each rule is what it is), the inputs stay
clear of it, and each test says where:
- ``to_mx`` clamps its float32 scale at 2^-126, so a block whose E8M0 exponent is -127 (amax below about 2^-118) is
  scaled differently: block amaxes stay above 2^-100;
- the RCEIL fallback of eager torchao takes ``ceil(log2(r))`` in float32, which rounds an r a few ulps above a power
  of two down to it (one binade low: the block's largest element then saturates); the hardware instruction torchao
  uses when compiled on Blackwell (``cvt.rp.ue8m0``) and TransformerEngine round up exactly, as the op does: r stays
  at least 2^-16 relative away from a power of two (test_readiness_reference.py pins the exact rounding);
- ``nvfp4_quantize`` clamps each block scale up to E4M3's smallest normal, which hides a scale that underflows
  (counted in ``scale_flushed`` here): every block's amax stays above the tensor amax / 2^14; and it multiplies x by
  fl32(fl32(1 / d) / s_b) where the rule divides by fl32(d * s_b) (TransformerEngine does the same), so an x / total
  on or within an ulp of an E2M1 tie (frequent with bfloat16 inputs) may go either way there: within four ulps of a
  tie the oracle rounds fl32(x / total) as the rule does, and every other element is torchao's.
- the FP8 quantizers clamp an amax at 1e-12 before dividing: amaxes stay above it.
Skipped without torchao."""

from __future__ import annotations

import pytest
import torch

from amp_inspect import format_readiness

pytest.importorskip("torchao", minversion="0.18")  # the quantizers below, as this file reads them
mx = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
nvfp4 = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
config = pytest.importorskip("torchao.prototype.mx_formats.config")

MX_BLOCK = 32
NVFP4_BLOCK = 16
E8M0_BIAS = 127
ROWS, COLS = 96, 1024
SUM_RTOL = 1e-12

# name: (torchao element dtype, largest finite value, the least |v| the cast clamps: max plus half an ulp, where
# a tie rounds up (E5M2, E2M1: max has an odd mantissa) or just past it (E4M3: 464 rounds to the even 448))
ELEMENTS = {
    "e4m3": (torch.float8_e4m3fn, 448.0, 464.0, False),
    "e5m2": (torch.float8_e5m2, 57344.0, 61440.0, True),
    "e2m1": (torch.float4_e2m1fn_x2, 6.0, 7.0, True),
}
MX_RECIPES = {
    "mxfp8_e4m3": "e4m3",
    "mxfp8_e5m2": "e5m2",
    "mxfp4": "e2m1",
}


def element_codes(data_lp: torch.Tensor, element: str, shape: tuple[int, ...]) -> torch.Tensor:
    """torchao's element codes as float64 values (FP4 is packed two to a byte)."""
    if element == "e2m1":
        return kernels.f4_unpacked_to_f32(kernels.unpack_uint4(data_lp)).reshape(shape).double()
    return data_lp.to(torch.float32).reshape(shape).double()


def clamped(v: torch.Tensor, element: str) -> torch.Tensor:
    """Where the element cast clamps |v| (the op's ``saturated``)."""
    _, _, edge, tie_clamps = ELEMENTS[element]
    return v.abs() >= edge if tie_clamps else v.abs() > edge


def counts_from(x: torch.Tensor, dequantized: torch.Tensor, v: torch.Tensor, element: str) -> tuple[int, int, float]:
    """(flushed, saturated, sq_error) of x (float64) given its dequantized values and scaled values v."""
    flushed = int(((x != 0) & (dequantized == 0)).sum())
    saturated = int(clamped(v, element).sum())
    return flushed, saturated, float(((x - dequantized) ** 2).sum())


def assert_equal_to_op(x: torch.Tensor, recipe: str, oracle: tuple[int, int, float]) -> None:
    stats = format_readiness([x], recipe)
    flushed, saturated, sq_error = oracle
    assert int(stats.flushed[0, 0]) == flushed, recipe
    assert int(stats.saturated[0, 0]) == saturated, recipe
    assert float(stats.sq_error[0, 0]) == pytest.approx(sq_error, rel=SUM_RTOL, abs=0.0), recipe


def mx_oracle(x: torch.Tensor, element: str, mode: object) -> tuple[int, int, float]:
    """Quantized by torchao's to_mx; v = x * 2^-X from torchao's E8M0 exponent X (exact in float64)."""
    dtype = ELEMENTS[element][0]
    scale, data_lp = mx.to_mx(x, dtype, MX_BLOCK, scaling_mode=mode)
    blocks = (*x.shape[:-1], x.shape[-1] // MX_BLOCK, MX_BLOCK)
    exponent = scale.view(torch.uint8).to(torch.float64) - E8M0_BIAS
    assert (scale.view(torch.uint8) != 0xFF).all(), "no NaN scale: the inputs are finite"
    codes = element_codes(data_lp, element, blocks)
    x64 = x.double().reshape(blocks)
    dequantized = codes * torch.exp2(exponent)[..., None]
    v = x64 * torch.exp2(-exponent)[..., None]
    return counts_from(x64, dequantized, v, element)


E2M1_TIES = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float64)
E2M1_BELOW = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0], dtype=torch.float64)  # each tie's neighbours
E2M1_ABOVE = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)
E2M1_EVEN = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0], dtype=torch.float64)  # where a tie itself rounds
NEAR_TIE = 2.0**-21  # relative: four float32 ulps, more than a product and a quotient of the same scales part by


def nearest_tie(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each |v|: the index of the nearest E2M1 tie (halfway between two E2M1 values) and whether |v| is within
    NEAR_TIE of it."""
    a = v.abs()
    right = torch.searchsorted(E2M1_TIES, a).clamp(max=len(E2M1_TIES) - 1)
    left = (right - 1).clamp(min=0)
    index = torch.where((a - E2M1_TIES[left]).abs() < (a - E2M1_TIES[right]).abs(), left, right)
    tie = E2M1_TIES[index]
    return index, (a - tie).abs() <= tie * NEAR_TIE


def rounded_near_ties(v: torch.Tensor, codes: torch.Tensor) -> tuple[torch.Tensor, int]:
    """torchao's codes, except within NEAR_TIE of a tie, where v (fl32(x / total)) is rounded as the rule rounds it:
    to the neighbour on its side, a tie to even. Returns the codes and how many elements were near a tie."""
    index, near = nearest_tie(v)
    a, tie = v.abs(), E2M1_TIES[index]
    rounded = torch.where(a < tie, E2M1_BELOW[index], torch.where(a > tie, E2M1_ABOVE[index], E2M1_EVEN[index]))
    return torch.where(near, torch.sign(v) * rounded, codes), int(near.sum())


def wide_range_blocks(seed: int, dtype: torch.dtype, block: int, low: int, high: int) -> torch.Tensor:
    """Gaussian blocks, each at its own binade in [low, high), with the cases that move counts: outliers, blocks
    whose amax mantissa is above the element format's largest (they saturate under the floor rule), zeros, and
    float32 subnormal elements beside normal ones."""
    g = torch.Generator().manual_seed(seed)
    per_block = torch.exp2(torch.randint(low, high, (ROWS, COLS // block, 1), generator=g).float())
    x = torch.randn(ROWS, COLS // block, block, generator=g) * per_block
    x[::5, ::3, 7] *= 1000.0  # outliers: the rest of their blocks flushes
    x[1::7, :, 0] = 1.96875 * per_block[1::7, :, 0] * 4  # amax mantissa 1.97: saturates E4M3, E5M2, E2M1
    x[3::13, :, 5] = 1e-40  # float32 subnormals inside normal blocks
    x[2::11, 1::2] = 0.0  # whole zero blocks (after the subnormals: no block holds subnormals alone)
    return x.reshape(ROWS, COLS).to(dtype).contiguous()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("recipe", sorted(MX_RECIPES))
def test_mx_floor_recipes_equal_torchaos_to_mx(recipe, dtype):
    element = MX_RECIPES[recipe]
    for seed in range(3):
        x = wide_range_blocks(seed, dtype, MX_BLOCK, -90, 90)
        oracle = mx_oracle(x.float(), element, config.ScaleCalculationMode.FLOOR)
        assert oracle[0] > 0 and oracle[1] > 0, "the inputs flush and saturate elements"
        assert_equal_to_op(x, recipe, oracle)


def test_mxfp8_rceil_equals_torchaos_to_mx_away_from_powers_of_two():
    for seed in range(3):
        x = wide_range_blocks(seed, torch.float32, MX_BLOCK, -90, 90)
        # r = amax_b / 448 at least 2^-16 relative above a power of two (the module docstring says why)
        blocks = x.reshape(ROWS, -1, MX_BLOCK)
        r = blocks.abs().amax(-1) / 448.0
        mantissa = r / torch.exp2(torch.floor(torch.log2(r.double())).float())
        near = (r > 0) & (mantissa - 1 < 2**-16)
        blocks[near] *= 1.25
        oracle = mx_oracle(x, "e4m3", config.ScaleCalculationMode.RCEIL)
        assert oracle[0] > 0 and oracle[1] == 0, "RCEIL flushes small elements and saturates none here"
        assert_equal_to_op(x, "mxfp8_e4m3_rceil", oracle)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_nvfp4_equals_torchaos_nvfp4_quantize_where_no_block_scale_is_clamped(dtype):
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        per_block = torch.exp2(torch.randint(-6, 7, (ROWS, COLS // NVFP4_BLOCK, 1), generator=g).float())
        x = (torch.randn(ROWS, COLS // NVFP4_BLOCK, NVFP4_BLOCK, generator=g) * per_block).reshape(ROWS, COLS)
        x = x.to(dtype).contiguous()
        x32 = x.float()
        tensor_scale = nvfp4.per_tensor_amax_to_scale(x32.abs().amax())
        scales, data_lp = nvfp4.nvfp4_quantize(x32, NVFP4_BLOCK, tensor_scale)
        block_scale = scales.to(torch.float32)
        assert block_scale.min() >= 2**-6, "every block scale is an E4M3 normal: torchao's clamp does not act"
        total = (tensor_scale * block_scale).reshape(ROWS, -1, 1)  # fl32(d * s_b), as the GEMM applies it
        blocks = (ROWS, COLS // NVFP4_BLOCK, NVFP4_BLOCK)
        codes = element_codes(data_lp, "e2m1", blocks)
        x64 = x32.double().reshape(blocks)
        v = (x32.reshape(blocks) / total).double()  # fl32(x / total)
        codes, near = rounded_near_ties(v, codes)
        assert near < x.numel() // 100, "the oracle stays torchao's but for a few elements near a tie"
        oracle = counts_from(x64, codes * total.double(), v, "e2m1")
        assert oracle[0] > 0, "the inputs flush elements"
        assert_equal_to_op(x, "nvfp4", oracle)


FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def current_scaling_oracle(x: torch.Tensor, element: str) -> tuple[int, int, float]:
    """torchao.float8's current (tensorwise) scaling of x: tensor_to_scale, then to_fp8_saturated of x * s."""
    float8_utils = pytest.importorskip("torchao.float8.float8_utils")
    fp8 = FP8_DTYPES[element]
    scale = float8_utils.tensor_to_scale(x, fp8)
    codes = float8_utils.to_fp8_saturated(x * scale, fp8).to(torch.float32)
    return fp8_oracle(x.reshape(1, -1), scale.reshape(1, 1), codes.reshape(1, -1), element)


def fp8_oracle(x: torch.Tensor, scale: torch.Tensor, codes: torch.Tensor, element: str) -> tuple[int, int, float]:
    """An fp32-scaled recipe from torchao's scale s (one per row of ``x``'s blocks) and codes: v = fl32(x * s),
    dequantized q / s rounded once in float64 (as the rule says)."""
    s = scale.to(torch.float32)
    v = (x * s).double()
    return counts_from(x.double(), codes.double() / s.double(), v, element)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("element", sorted(FP8_DTYPES))
def test_fp8_tensor_scaled_recipes_equal_torchaos_current_scaling(element, dtype):
    """torchao.float8's tensor_to_scale (s = fl32(max_E / amax), the quotient taken in float64: the same float32 s)
    and to_fp8_saturated. torchao clamps the amax at 1e-12 before dividing: tensors' amaxes stay above it."""
    for seed in range(3):
        x = wide_range_blocks(seed, dtype, MX_BLOCK, -20, 20).float()
        oracle = current_scaling_oracle(x, element)
        assert oracle[0] > 0, "the inputs flush elements"
        assert_equal_to_op(x.to(dtype), f"fp8_{element}_tensor", oracle)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_fp8_block128_recipe_equals_torchaos_blockwise_quantization(dtype):
    """torchao's blockwise FP8 training quantizer of activations (torch_blockwise_scale_act_quant_lhs: 1 x 128 tiles,
    s = fl32(448 / amax) from a float64 quotient). It clamps each amax at 1e-12: block amaxes stay above it."""
    blockwise = pytest.importorskip("torchao.prototype.blockwise_fp8_training.kernels")
    block = 128
    for seed in range(3):
        x = wide_range_blocks(seed, dtype, block, -30, 30).float()
        codes, reciprocal = blockwise.torch_blockwise_scale_act_quant_lhs(x, block)
        # torchao hands back fl32(1 / s), from which s cannot be recovered exactly: s as its source makes it, held
        # to the reciprocal it returned
        blocks = x.reshape(-1, block)
        scale = (448.0 / blocks.abs().amax(1).double().clamp(min=1e-12)).to(torch.float32)
        assert torch.equal((1.0 / scale).reshape(reciprocal.shape), reciprocal), "the scale torchao used"
        oracle = fp8_oracle(blocks, scale.reshape(-1, 1), codes.to(torch.float32).reshape(-1, block), "e4m3")
        assert oracle[0] > 0, "the inputs flush elements"
        assert_equal_to_op(x.to(dtype), "fp8_e4m3_block128", oracle)


def test_readiness_hooks_on_torchaos_float8_linear_measure_what_its_cast_does():
    """A model converted by torchao's convert_to_float8_training (Float8Linear, a subclass of nn.Linear, current
    tensorwise scaling): the readiness hooks measure X, W, dY and dW of each converted module, under the names of
    the model, and fp8_e4m3_tensor's count and error on X are those of torchao's own cast of that X."""
    float8 = pytest.importorskip("torchao.float8")
    import amp_inspect

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64))
    float8.convert_to_float8_training(model)
    assert type(model[0]).__name__ == "Float8Linear"
    inputs: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(lambda module, args: inputs.append(args[0].detach().clone()))
    insp = amp_inspect.attach(model, readiness_every=1)
    x = torch.randn(32, 64) * torch.logspace(-6, 2, 64)  # columns over eight decades: some flush in E4M3
    model(x).pow(2).mean().backward()
    insp.check()
    report = insp.readiness()
    assert report is not None and set(report.modules) == {"0", "2"}
    assert all(list(operands) == ["X", "W", "dY", "dW"] for operands in report.modules.values())
    (seen,) = inputs
    flushed, _, sq_error = current_scaling_oracle(seen, "e4m3")
    stats, r = report.modules["0"]["X"], report.recipes.index("fp8_e4m3_tensor")
    assert flushed > 0
    assert stats.flushed[r] == flushed
    assert stats.sq_error[r] == pytest.approx(sq_error, rel=SUM_RTOL, abs=0.0)
