// readiness.h: the element logic of format readiness (issue 21), written once for the CPU and CUDA kernels; at the
// end, the plan and work geometry the host hands the CUDA kernels.
//
// What a GEMM recipe (FP8 per tensor or per 1x128 block, MXFP8, MXFP4, NVFP4) would do to one element: its
// block's scale (from the block's amax, and the tensor's for NVFP4), the element's saturating round-to-nearest-
// even cast to the recipe's element format, and the judgement the kernels count: flushed (a finite nonzero x
// whose dequantized value is 0), saturated (a |v| the cast clamps: clip_bits) and the squared
// error (x - dequant)^2 in float64. The rules are amp_inspect/core/recipes.py's docstring, implemented as written;
// the recipe table kRecipes has core/recipes.py's RECIPES order and amp_inspect._C.layout() reports it, so a binary
// with another table is refused (statistics.readiness_layout_problem).
//
// Exactness, and immunity to flush-to-zero / denormals-are-zero modes (torch.set_flush_denormal, nvcc's
// -ftz=true). Every float32 value a rule computes with fl32(...) is computed one of two ways, with the same result:
// - on the bits (judge_element, cast_magnitude, round_to_float32_bits): a float64 operation on exactly widened
//   float32 operands, rounded to float32 on the integer bits. A float64 product of two float32 values is exact, and
//   the float64 quotient rounded again to float32 is the correctly rounded float32 quotient (double rounding is
//   innocuous for +, -, *, / from a format of at least 2p + 2 bits, 53 >= 2 * 24 + 2); no float64 here is ever
//   subnormal (the smallest is about 2^-300), so no FPU mode sees a subnormal. The one conversion left to the
//   hardware is an element's scaled value v: a result below float32's normal range may be flushed there, and such
//   a v (< 2^-126) casts to 0 in every element format (their smallest subnormal is 2^-16 or more) either way.
// - by the hardware's float32 operation where that is certainly IEEE's: both operands normal floats and the result
//   normal (fl32_divide, fl32_multiply check it and fall back to the bits), or, per element, x no float32 subnormal
//   and the scale a normal float (judge_element_fast; the kernels check per block). These are the fast paths.
// Never build with fast-math.
// Contraction into fused multiply-adds (GCC's default for C++, nvcc's --fmad=true) changes no result: every product
// here that meets an addition is exact in float64 (q times a power of two, or q's 2 bits times a 24-bit scale),
// but the squared errors added into sums, whose rounding the sums' stated tolerance already allows.
//
// Torch-free and host+device (AMPI_HD from common/numerics.h); the tables (kRecipes, kElementGrids) are host-only:
// the host copies what a call needs into the kernels' arguments, as tensor_stats does with its kFormatBounds.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/numerics.h"

namespace amp_inspect {

// ---- the tables: element formats, scale rules, recipes (the order of amp_inspect/core/recipes.py) ----

// The element formats' grids, in the order of recipes.ELEMENT_FORMATS. A grid has `mbits` mantissa bits,
// normal exponents emin..emax, and its largest finite value as float32 bits (every value of these grids is a
// float32, so a cast can be computed on float32 bits and returned exactly).
enum ElementId : int32_t { kElementE4M3 = 0, kElementE5M2 = 1, kElementE2M1 = 2, kNumElementFormats = 3 };

struct ElementGrid {
  int32_t mbits;
  int32_t emin;
  int32_t emax;
  uint32_t max_bits;  // float32 bits of the largest finite value
};

// Functions as well as the table, so that device code (NVFP4's E4M3 block scale) can name a grid.
// OCP FP8 E4M3 (float8_e4m3fn): max 448 = 1.75 * 2^8, no Inf.
AMPI_HD constexpr ElementGrid e4m3_grid() { return {3, -6, 8, 0x43E00000u}; }
// OCP FP8 E5M2: max 57344 = 1.75 * 2^15 (the recipes' casts saturate: Inf is never produced).
AMPI_HD constexpr ElementGrid e5m2_grid() { return {2, -14, 15, 0x47600000u}; }
// OCP FP4 E2M1: 0, 0.5, 1, 1.5, 2, 3, 4, 6.
AMPI_HD constexpr ElementGrid e2m1_grid() { return {1, 0, 2, 0x40C00000u}; }
constexpr ElementGrid kElementGrids[kNumElementFormats] = {e4m3_grid(), e5m2_grid(), e2m1_grid()};
constexpr const char* kElementNames[kNumElementFormats] = {"e4m3", "e5m2", "e2m1"};

// The scale rules, in the order of recipes.SCALE_RULES.
enum ScaleRule : int32_t {
  kScaleFp32Tensor = 0,  // s = fl32(max_E / amax_t), TransformerEngine's current scaling
  kScaleFp32Block = 1,   // the same per block (1x128, DeepSeek-V3 style)
  kScaleE8M0Floor = 2,   // OCP MX v1.0: X = floor(log2 amax_b) - emax_E
  kScaleE8M0Rceil = 3,   // the E8M0 exponent rounded up (TransformerEngine's MXFP8, torchao's RCEIL)
  kScaleNvfp4 = 4,       // an E4M3 scale per 16 elements under an fp32 tensor scale
  kNumScaleRules = 5,
};
constexpr const char* kScaleRuleNames[kNumScaleRules] = {"fp32_tensor", "fp32_block", "e8m0_floor", "e8m0_rceil",
                                                          "nvfp4"};

struct RecipeSpec {
  const char* name;
  int32_t element;  // ElementId
  int32_t block;    // elements per block along the last dimension; 0: one scale for the whole tensor
  int32_t scale;    // ScaleRule
};

constexpr int kNumRecipes = 8;
constexpr RecipeSpec kRecipes[kNumRecipes] = {
    {"fp8_e4m3_tensor", kElementE4M3, 0, kScaleFp32Tensor},
    {"fp8_e5m2_tensor", kElementE5M2, 0, kScaleFp32Tensor},
    {"fp8_e4m3_block128", kElementE4M3, 128, kScaleFp32Block},
    {"mxfp8_e4m3", kElementE4M3, 32, kScaleE8M0Floor},
    {"mxfp8_e5m2", kElementE5M2, 32, kScaleE8M0Floor},
    {"mxfp8_e4m3_rceil", kElementE4M3, 32, kScaleE8M0Rceil},
    {"mxfp4", kElementE2M1, 32, kScaleE8M0Floor},
    {"nvfp4", kElementE2M1, 16, kScaleNvfp4},
};

// Block sizes the kernels measure amaxes for: each 128-element block's amax is the max of its 16-element
// sub-blocks' (and a 32-element block's of two of them), so one read of 128 elements serves every recipe.
constexpr int32_t kLargestBlock = 128;
constexpr int32_t kSmallestBlock = 16;
static_assert(kLargestBlock % kSmallestBlock == 0, "sub-blocks tile a largest block");

constexpr int32_t kE8M0MinExponent = -127;  // E8M0 encodes 2^-127 .. 2^127 (0xFF is NaN)
constexpr int32_t kE8M0MaxExponent = 127;
constexpr double kNvfp4TensorDivisor = 448.0 * 6.0;  // E4M3's max times E2M1's max
constexpr uint32_t kE4M3MinNormalBits = 0x3C800000u;  // 2^-6: an NVFP4 block scale below it is subnormal
constexpr uint32_t kFloatMaxBits = 0x7F7FFFFFu;       // FLT_MAX, the fp32 scale where max_E / amax overflows

// Whether the rule needs the tensor's amax before the pass (recipes.Recipe.needs_tensor_amax).
AMPI_HD bool needs_tensor_amax(int32_t scale) { return scale == kScaleFp32Tensor || scale == kScaleNvfp4; }

// The op's columns: counts [T, 3 + 4R] = numel, nonzero, nonfinite, then per recipe flushed, saturated, blocks,
// scale_flushed; sums [T, 1 + R] = sq_signal, then sq_error per recipe.
constexpr int kReadinessFixedCounts = 3;
constexpr int kReadinessCountsPerRecipe = 4;
constexpr int kReadinessFixedSums = 1;
constexpr int kReadinessSumsPerRecipe = 1;
AMPI_HD int readiness_count_columns(int num_recipes) {
  return kReadinessFixedCounts + kReadinessCountsPerRecipe * num_recipes;
}
AMPI_HD int readiness_sum_columns(int num_recipes) {
  return kReadinessFixedSums + kReadinessSumsPerRecipe * num_recipes;
}

// ---- exact conversions between float32 bits and float64, on the integer bits ----

// (the float32 / float64 field constants and the bit casts are common/numerics.h's)
constexpr double kFloatSubnormalUnit = 1.4012984643248171e-45;  // 2^-149, a normal float64

// 2^e as float64, exactly, for e in [-1022, 1023].
AMPI_HD double pow2(int32_t e) {
  return bits_as_float64(static_cast<uint64_t>(e + kExponentBias64) << kMantissaBits64);
}

// The finite float32 of `bits` as float64, exactly. Normal values are re-biased on the bits; a float32
// subnormal is its mantissa (an integer, converted exactly) times 2^-149 (a normal float64): no float32
// subnormal ever reaches the FPU, so DAZ cannot zero it.
AMPI_HD double float32_bits_to_double(uint32_t bits) {
  const uint32_t a = bits & kAbsMask32;
  const uint32_t field = a >> kMantissaBits32;
  const uint64_t sign = static_cast<uint64_t>(bits & kSignMask32) << 32;
  if (field == 0) {
    const double magnitude = static_cast<double>(a) * kFloatSubnormalUnit;
    return (bits & kSignMask32) ? -magnitude : magnitude;
  }
  const uint64_t rebiased = static_cast<uint64_t>(field + (kExponentBias64 - kExponentBias32)) << kMantissaBits64;
  return bits_as_float64(sign | rebiased | (static_cast<uint64_t>(a & kMantissaMask32) << (kMantissaBits64 -
                                                                                            kMantissaBits32)));
}

// Rounds m * 2^-shift to an integer, ties to even (m < 2^63, shift in [1, 63]).
AMPI_HD uint64_t round_shift_even(uint64_t m, int shift) {
  const uint64_t q = m >> shift;
  const uint64_t rest = m & ((uint64_t{1} << shift) - 1);
  const uint64_t half = uint64_t{1} << (shift - 1);
  return q + ((rest > half) | ((rest == half) & (q & 1)));
}

// The float32 nearest to d, ties to even, as bits (sign kept): fl32 of the float64 value d, float32's subnormals
// included and overflow to Inf, computed on the integer bits. d is finite; float64 subnormals (never met here)
// round to zero, as their float32 rounding does.
AMPI_HD uint32_t round_to_float32_bits(double d) {
  const uint64_t bits = float64_as_bits(d);
  const uint32_t sign = static_cast<uint32_t>(bits >> 32) & kSignMask32;
  const int32_t field = static_cast<int32_t>((bits >> kMantissaBits64) & 0x7FF);
  constexpr int32_t kLowestNormal32 = 1 - kExponentBias32;  // -126
  // Below 2^-151 everything rounds to zero (2^-150, half the smallest subnormal, is a tie rounding to 0).
  if (field < kExponentBias64 + kLowestNormal32 - kMantissaBits32 - 2) return sign;
  const int32_t e = field - kExponentBias64;  // d = m * 2^(e - 52) with m in [2^52, 2^53)
  const uint64_t m = (bits & kMantissaMask64) | (uint64_t{1} << kMantissaBits64);
  // In float32's normal range the quantum is 2^(e - 23); below it, the subnormals' 2^-149.
  const int32_t quantum_exponent = (e > kLowestNormal32 ? e : kLowestNormal32) - kMantissaBits32;
  const uint64_t q = round_shift_even(m, quantum_exponent - (e - kMantissaBits64));
  // q * 2^quantum_exponent as float32 bits: q in [2^23, 2^24] above the subnormals (a carry to 2^24 moves to the
  // next binade by the addition), q <= 2^23 below them (2^23 is the smallest normal).
  const uint64_t binade = static_cast<uint64_t>(quantum_exponent - (kLowestNormal32 - kMantissaBits32)) << kMantissaBits32;
  const uint64_t magnitude = binade + q;  // 64-bit: a float64 far above float32's range has a large binade
  return sign | (magnitude >= kInfBits32 ? kInfBits32 : static_cast<uint32_t>(magnitude));
}

// floor(log2 a) of a finite float32 a > 0, from its bits (subnormals by their highest mantissa bit).
AMPI_HD int32_t highest_bit(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return 31 - __clz(v);
#else
  return 31 - __builtin_clz(v);
#endif
}
AMPI_HD int32_t floor_log2_bits(uint32_t abs_bits) {
  const int32_t field = static_cast<int32_t>(abs_bits >> kMantissaBits32);
  if (field == 0) return highest_bit(abs_bits) - (kMantissaBits32 + kExponentBias32 - 1);  // m * 2^-149
  return field - kExponentBias32;
}
// The least integer X with 2^X >= a, for a finite float32 a > 0: floor(log2 a), plus one unless a is a power of two.
AMPI_HD int32_t ceil_log2_bits(uint32_t abs_bits) {
  const int32_t field = static_cast<int32_t>(abs_bits >> kMantissaBits32);
  const bool power_of_two = field == 0 ? (abs_bits & (abs_bits - 1)) == 0 : (abs_bits & kMantissaMask32) == 0;
  return floor_log2_bits(abs_bits) + (power_of_two ? 0 : 1);
}

// ---- the element cast ----

// cast_E(v) of a float32 v (|bits| `abs_bits`, finite or Inf): |v| rounded to nearest, ties to even, on grid g
// (its subnormals included), saturating at g's largest finite value. Returned as a float64 magnitude (exact:
// a small integer times a power of two). Branch-free integer work, so vector loops can run it lane by lane.
// In the binade [2^e, 2^(e+1)) with e >= emin the quantum is 2^(e - mbits); below 2^emin, 2^(emin - mbits).
AMPI_HD double cast_magnitude(uint32_t abs_bits, const ElementGrid& g) {
  const uint32_t a = abs_bits > g.max_bits ? g.max_bits : abs_bits;  // saturate (max is on the grid)
  const int32_t field = static_cast<int32_t>(a >> kMantissaBits32);
  const int32_t lowest_field = g.emin + kExponentBias32;
  const int32_t quantum_field = field > lowest_field ? field : lowest_field;
  // a = m * 2^(field - 150) for a normal float32; the quantum is 2^(quantum_field - 127 - mbits), so m is shifted
  // right by quantum_field - field + 23 - mbits. A float32 subnormal (field 0) is below 2^-126, far under half of
  // any grid's smallest subnormal: it is treated as m = 0 (a shift of 25 or more leaves 0 from any m < 2^24).
  const uint32_t m = field == 0 ? 0u : ((a & kMantissaMask32) | kImplicitBit32);
  int32_t shift = quantum_field - field + kMantissaBits32 - g.mbits;
  shift = shift > 25 ? 25 : shift;
  const uint64_t q = round_shift_even(m, shift);
  return static_cast<double>(q) * pow2(quantum_field - kExponentBias32 - g.mbits);
}

// cast_E(v) as float32 bits: |v| (bits `abs_bits`, finite or Inf) rounded to nearest, ties to even, on grid g,
// saturating at its max; the same values as cast_magnitude, for judge_element_fast. In g's normal range the
// rounding is on the bits (adding just under half a quantum, plus the kept last bit for ties to even, carries into
// the exponent where it must); below 2^emin, float32's own rounding of |v| + 2^(emin - mbits + 23), whose ulp is
// the grid's subnormal quantum, less that constant (exact). No operand or result there is a float32 subnormal but
// |v| itself, and a |v| below 2^-126 rounds to 0 whether DAZ reads it as 0 or not.
AMPI_HD uint32_t cast_abs_bits(uint32_t abs_bits, const ElementGrid& g) {
  const uint32_t a = abs_bits > g.max_bits ? g.max_bits : abs_bits;
  const int32_t shift = kMantissaBits32 - g.mbits;
  const uint32_t rounded = (a + ((1u << (shift - 1)) - 1u) + ((a >> shift) & 1u)) & ~((1u << shift) - 1u);
  const float quantum_shift = bits_as_float32(static_cast<uint32_t>(g.emin - g.mbits + kMantissaBits32 + kExponentBias32)
                                              << kMantissaBits32);
  const float below = (bits_as_float32(a) + quantum_shift) - quantum_shift;
  const uint32_t lowest_normal = static_cast<uint32_t>(g.emin + kExponentBias32) << kMantissaBits32;
  return a >= lowest_normal ? rounded : float32_as_bits(below);
}

// fl32(a / b) and fl32(a * b) of finite float32 values a >= 0, b > 0 (bits), as bits: the hardware's float32
// result where it is certainly IEEE's (both operands normal and the result normal or Inf, so that neither DAZ nor
// flush-to-zero can have touched it; nvcc's default -prec-div=true makes its division IEEE's), else the float64
// result rounded on the bits. The block scales' arithmetic: per block, so the fast case matters on the CPU.
AMPI_HD uint32_t fl32_divide(uint32_t a, uint32_t b) {
  if (a >= kImplicitBit32 && b >= kImplicitBit32) {
    const uint32_t q = float32_as_bits(bits_as_float32(a) / bits_as_float32(b));
    if (q >= kImplicitBit32) return q;
  }
  return round_to_float32_bits(float32_bits_to_double(a) / float32_bits_to_double(b));
}
AMPI_HD uint32_t fl32_multiply(uint32_t a, uint32_t b) {
  if (a >= kImplicitBit32 && b >= kImplicitBit32) {
    const uint32_t p = float32_as_bits(bits_as_float32(a) * bits_as_float32(b));
    if (p >= kImplicitBit32) return p;
  }
  return round_to_float32_bits(float32_bits_to_double(a) * float32_bits_to_double(b));
}

// ---- block scales ----

// What one block's scale does to its elements. `divide` 0: v = fl32(x * scale), dequantized q / scale (the fp32
// rules; the E8M0 rules with scale = 2^-X, where both are exact); `divide` 1: v = fl32(x / scale), dequantized
// q * scale (NVFP4's total scale). `all_zero`: every element dequantizes to 0 (NVFP4 with total = 0).
struct BlockScale {
  double scale;
  int32_t divide;
  int32_t all_zero;
  int32_t scale_flushed;  // the block's scale is at its limit (counted once per block, when its amax is > 0)
};

// Whether a scale may take judge_element_fast: a normal float32 (judge_element_fast's comment says why). Every
// scale is a float32 value, so comparing it as a float64 with float32's normal range decides.
constexpr double kFloatMinNormal = 1.1754943508222875e-38;  // 2^-126
constexpr double kFloatMax = 3.4028234663852886e+38;
AMPI_HD bool scale_is_normal_float(const BlockScale& s) {
  return !s.all_zero && s.scale >= kFloatMinNormal && s.scale <= kFloatMax;
}

// fp32_tensor / fp32_block: s = fl32(max_E / amax); 1 where amax is 0 or (a given tensor amax) Inf or NaN, as
// TransformerEngine's compute_scale_from_amax does; FLT_MAX where the division overflows. amax_bits: |amax|.
AMPI_HD BlockScale fp32_scale(uint32_t amax_bits, const ElementGrid& g) {
  BlockScale s{1.0, 0, 0, 0};
  if (amax_bits == 0 || !is_finite32(amax_bits)) return s;
  const uint32_t q = fl32_divide(g.max_bits, amax_bits);
  s.scale_flushed = q >= kInfBits32;
  s.scale = float32_bits_to_double(s.scale_flushed ? kFloatMaxBits : q);
  return s;
}

// An E8M0 exponent wanted by a block, clamped to E8M0's range (clamping counts as the scale at its limit).
AMPI_HD BlockScale e8m0_scale(int32_t wanted) {
  const int32_t x = wanted < kE8M0MinExponent ? kE8M0MinExponent : (wanted > kE8M0MaxExponent ? kE8M0MaxExponent : wanted);
  return BlockScale{pow2(-x), 0, 0, x != wanted};
}

// e8m0_floor (OCP MX v1.0 section 6.3): X = floor(log2 amax_b) - emax_E; -127 where amax_b = 0.
AMPI_HD BlockScale e8m0_floor_scale(uint32_t amax_bits, const ElementGrid& g) {
  if (amax_bits == 0) return BlockScale{pow2(-kE8M0MinExponent), 0, 0, 0};
  return e8m0_scale(floor_log2_bits(amax_bits) - g.emax);
}

// e8m0_rceil: r = fl32(amax_b / max_E), X = ceil(log2 r); -127 where amax_b = 0. A block with amax_b > 0 whose r
// rounds to 0 wanted an exponent below -127: clamped, so counted (as the float64 reference reads the rule).
AMPI_HD BlockScale e8m0_rceil_scale(uint32_t amax_bits, const ElementGrid& g) {
  if (amax_bits == 0) return BlockScale{pow2(-kE8M0MinExponent), 0, 0, 0};
  const uint32_t r = fl32_divide(amax_bits, g.max_bits);
  if (r == 0) return BlockScale{pow2(-kE8M0MinExponent), 0, 0, 1};
  return e8m0_scale(ceil_log2_bits(r));
}

// NVFP4's tensor decode scale d = fl32(amax_t / (448 * 6)), as float32 bits (amax_t_bits: |amax_t|); 1 where amax_t
// is 0, Inf or NaN (a given, stale amax; TransformerEngine's compute_global_encode_scaling_factor_FP4 does the same;
// a tensor whose own amax is 0 holds only zeros). A tiny amax_t (below about 2^-138) gives d = 0.
constexpr uint32_t kFloatOneBits = 0x3F800000u;
constexpr uint32_t kNvfp4TensorDivisorBits = 0x45280000u;  // 2688 = 1.3125 * 2^11
AMPI_HD uint32_t nvfp4_decode_scale_bits(uint32_t amax_t_bits) {
  if (amax_t_bits == 0 || !is_finite32(amax_t_bits)) return kFloatOneBits;
  return fl32_divide(amax_t_bits, kNvfp4TensorDivisorBits);
}

// nvfp4 per block: s_b = cast_E4M3(fl32(fl32(amax_b / 6) / d)) (saturating at 448, subnormals kept, not clamped up
// to E4M3's smallest normal), total = fl32(d * s_b). total = 0: the block dequantizes to 0. A block with
// amax_b > 0 whose s_b is zero or an E4M3 subnormal counts as flushed scale. (amax_b = 0: s_b = 0, total = 0,
// not counted.)
AMPI_HD BlockScale nvfp4_scale(uint32_t amax_b_bits, uint32_t decode_bits) {
  if (amax_b_bits == 0) return BlockScale{1.0, 1, 1, 0};
  const uint32_t per_six = fl32_divide(amax_b_bits, e2m1_grid().max_bits);  // amax_b / 6
  // s_b = 0 where fl32(amax_b / 6) = 0 (amax_b = 2^-149), whatever d is (core/recipes.py: not 0 / 0 when d = 0).
  // d = 0 with fl32(amax_b / 6) > 0: the quotient is +Inf, saturating to 448, and total = 0.
  const uint32_t wanted = per_six == 0 ? 0u : decode_bits == 0 ? kInfBits32 : fl32_divide(per_six, decode_bits);
  const uint32_t s_b = cast_abs_bits(wanted, e4m3_grid());  // an E4M3 value, as float32 bits
  const uint32_t total = s_b == 0 || decode_bits == 0 ? 0u : fl32_multiply(decode_bits, s_b);
  const int32_t flushed_scale = s_b < kE4M3MinNormalBits;
  if (total == 0) return BlockScale{1.0, 1, 1, flushed_scale};
  return BlockScale{float32_bits_to_double(total), 1, 0, flushed_scale};
}

// The block scale of one recipe: `amax_bits` the block's amax (the tensor's for a tensor-scaled recipe) and
// `decode_bits` NVFP4's tensor decode scale (nvfp4_decode_scale_bits; ignored by the other rules).
AMPI_HD BlockScale block_scale(int32_t rule, const ElementGrid& g, uint32_t amax_bits, uint32_t decode_bits) {
  switch (rule) {
    case kScaleFp32Tensor:
    case kScaleFp32Block:
      return fp32_scale(amax_bits, g);
    case kScaleE8M0Floor:
      return e8m0_floor_scale(amax_bits, g);
    case kScaleE8M0Rceil:
      return e8m0_rceil_scale(amax_bits, g);
    default:
      return nvfp4_scale(amax_bits, decode_bits);
  }
}

// The smallest float32 |v| whose saturating cast clamps it: the values a cast without saturation would round
// past max_E (to Inf, NaN, or a value the format lacks). That is max_E plus half its ulp, which itself rounds
// up (is clamped) when max_E's last mantissa bit is odd (E5M2's 57344, E2M1's 6) and down to max_E when it is
// even (E4M3's 448: 464 rounds to 448, as tensor_stats' e4m3 overflow bound says). A |v| in (max_E, that bound)
// is not counted as saturated: it rounds to max_E as any value rounds to its neighbour, and its error is in
// sq_error. (An fp32 scale fl32(max_E / amax) rounds up about one block in ten, putting amax one float32
// above max_E: counting those would report saturation where the cast loses nothing beyond rounding.)
AMPI_HD constexpr uint32_t clip_bits(const ElementGrid& g) {
  const int32_t ulp_shift = kMantissaBits32 - g.mbits;  // max_E's ulp, in float32 mantissa bits
  const uint32_t half_ulp_above = g.max_bits + (uint32_t{1} << (ulp_shift - 1));
  const bool max_is_even = ((g.max_bits >> ulp_shift) & 1u) == 0;
  return max_is_even ? half_ulp_above + 1 : half_ulp_above;
}

// ---- the judgement of one element ----

struct ElementVerdict {
  int32_t flushed;    // x finite, nonzero, and its dequantized value is 0
  int32_t saturated;  // |v| >= clip_bits(g): the cast clamped it
  double sq_error;    // (x - dequant(quant(x)))^2 in float64
};

// One finite element (float32 bits of x) under its block's scale.
AMPI_HD ElementVerdict judge_element(uint32_t bits, const ElementGrid& g, const BlockScale& s) {
  const double x = float32_bits_to_double(bits);
  const uint32_t a = bits & kAbsMask32;
  if (s.all_zero) return ElementVerdict{a != 0, 0, x * x};
  // The one hardware rounding of the file (header comment): a v below float32's normal range casts to 0 whether
  // or not it is flushed here. The float64 product is exact; the float64 quotient rounded to float32 is fl32's.
  const float v = static_cast<float>(s.divide ? x / s.scale : x * s.scale);
  const uint32_t v_abs = float32_as_bits(v) & kAbsMask32;
  const double q = cast_magnitude(v_abs, g);
  const double signed_q = (bits & kSignMask32) ? -q : q;
  const double dequantized = s.divide ? signed_q * s.scale : signed_q / s.scale;
  const double error = x - dequantized;
  return ElementVerdict{(a != 0) & (q == 0.0), v_abs >= clip_bits(g), error * error};
}

// judge_element for the common case, in float32 where the rule says fl32 and with the integer cast: the same
// verdict where x is no float32 subnormal and the scale (`scale32`, the float32 of s.scale) is a normal float32
// (scale_is_normal_float), so that the hardware's float32 product or quotient is fl32's whatever the FTZ / DAZ
// mode (its result may be flushed only below 2^-126, which casts to 0 either way). Kernels take it per block where
// the block holds no float32 subnormal; the CPU kernel's loops vectorise it.
// v = x / scale32 (`divide`, NVFP4) or x * scale32; dequantized q / dequant (`dequant_divides`: the fp32 rules,
// dequant = s) or q * dequant (NVFP4: the total scale; E8M0: 2^X, the same value as q / 2^-X, a multiplication in
// place of a division). A kernel may keep one scale per element, as the CPU kernel's loop over a 128-element block
// of 16- or 32-element blocks does.
AMPI_HD ElementVerdict judge_element_fast(uint32_t bits, const ElementGrid& g, bool divide, float scale32,
                                          bool dequant_divides, double dequant) {
  const float x = bits_as_float32(bits);
  const float v = divide ? x / scale32 : x * scale32;
  const uint32_t v_abs = float32_as_bits(v) & kAbsMask32;
  const uint32_t q_bits = cast_abs_bits(v_abs, g) | (bits & kSignMask32);
  const double q = static_cast<double>(bits_as_float32(q_bits));
  const double dequantized = dequant_divides ? q / dequant : q * dequant;
  const double error = static_cast<double>(x) - dequantized;
  return ElementVerdict{((bits & kAbsMask32) != 0) & ((q_bits & kAbsMask32) == 0), v_abs >= clip_bits(g),
                        error * error};
}

// fl64(q / s) without a division per element, for the fp32 rules' dequantization (the CUDA kernels): q an element
// grid's value as float64 (0 or a float32 of at most 4 significant bits, its sign included), s a normal float32 scale
// as float64 and r = fl64(1 / s), computed once per block. y = fl64(q * r) is within an ulp of q / s, the remainder
// q - y * s is exact in one fused multiply-add, and y + remainder * r rounds to fl64(q / s) (Markstein's correction).
// Checked for every case: scaling q or s by a power of two scales every step exactly (no float64 here is near
// under- or overflow: |q / s| lies in [2^-144, 2^142]), so the cases are q's 1 + mbits leading bits (mbits <= 3)
// times s's 2^23 mantissas, all tried by tests/test_readiness_emu.py (_readiness_quotient_mismatches).
AMPI_HD double grid_quotient(double q, double s, double r) {
  const double y = q * r;
  return fma(fma(-y, s, q), r, y);
}

// judge_element_fast's quantities before its verdict, for kernels that count per lane (the CUDA kernels): |v| and
// |q| as float32 bits and the squared error, under the same conditions (x no float32 subnormal, the scale a normal
// float32) and with the same values, but the fp32 rules' q / s computed as grid_quotient (`fp32_rule`: `dequant` is
// then fl64(1 / s), `scale` s). An element is flushed where x != 0 and q_abs == 0, saturated where
// v_abs >= clip_bits(g), as judge_element_fast says.
struct ElementCast {
  uint32_t v_abs;
  uint32_t q_abs;
  double sq_error;
};
AMPI_HD ElementCast cast_element_fast(uint32_t bits, const ElementGrid& g, bool divide, float scale32, bool fp32_rule,
                                      double scale, double dequant) {
  const float x = bits_as_float32(bits);
  const float v = divide ? x / scale32 : x * scale32;
  const uint32_t v_abs = float32_as_bits(v) & kAbsMask32;
  const uint32_t q_abs = cast_abs_bits(v_abs, g);
  const double q = static_cast<double>(bits_as_float32(q_abs | (bits & kSignMask32)));
  const double dequantized = fp32_rule ? grid_quotient(q, scale, dequant) : q * dequant;
  const double error = static_cast<double>(x) - dequantized;
  return ElementCast{v_abs, q_abs, error * error};
}

// ---- NVFP4 without a float32 division per element (the CUDA kernels) ----

// fl32(a / b) for a float32 a (0 or normal, either sign) and a normal float32 b > 0, from r = fl64(1 / b) (one
// reciprocal per lane or piece): fl32(fl64(a * r)), one float64 multiplication and one rounding to float32 in place
// of the float32 division. Equal to fl32(a / b) wherever a / b is in float32's normal range or overflows it (both
// then Inf); below 2^-126 the two may differ (a subnormal step, or 0 under flush-to-zero), which no caller sees:
// such a quotient casts to 0 in every element format (their smallest subnormal is 2^-16 or more).
// Why. Let a = A 2^i, b = B 2^j (A, B integers below 2^24) and a / b in the binade [2^e, 2^(e+1)), e >= -126.
// fl32 rounds at the midpoints M = K 2^(e-24), K odd in (2^24, 2^25) (the overflow threshold is one of them, at
// e = 127). a / b is never a midpoint: a = M b makes the odd K divide A, yet K > 2^24 > A. Otherwise
// a - M b = A 2^i - K B 2^(j+e-24) is a nonzero multiple of 2^min(i, j+e-24), so |a / b - M| / (a / b) is at least
// 2^(j+e-24) / a > 2^(j+e-24) / (2^(e+1) B 2^j) > 2^-49 (or 2^i / a > 2^-24); the last midpoint of the binade
// below, K 2^(e-25), likewise more than 2^-50: every midpoint is more than 2^-50 of a / b away, relatively. And
// fl64(a * r) is within (2^-53 + 2^-53 (1 + 2^-53)) a / b < 2^-51 a / b of a / b (r correctly rounded, then the
// product's rounding). So a / b and fl64(a * r) lie between the same two midpoints and
// round to the same float32 (53 >= 2 * 24 + 2 bits make the one double rounding innocuous). No exhaustive check is
// possible (2^46 pairs of significands); tests/test_readiness_emu.py checks it besides (_readiness_divide_mismatches:
// every b mantissa against the a nearest to random midpoints and its neighbours, and random pairs), as did, outside
// the suite, 2.6e9 more pairs (bench/README.md).
AMPI_HD float divide_by_reciprocal(float a, double r) { return static_cast<float>(static_cast<double>(a) * r); }

// NVFP4's block scale where every step is a quotient in float32's normal range (divide_by_reciprocal): amax_b at
// least 6 * 2^-126 (so amax_b / 6 is normal; `amax_b_bits` finite) and the decode scale d a normal float32
// (`decode`, with `decode_reciprocal` fl64(1 / d)). Then s_b = cast_E4M3(fl32(fl32(amax_b / 6) / d)), as
// nvfp4_scale's, with no float32 division: the second quotient may leave the normal range, but one below 2^-126
// casts to E4M3's 0 and one that overflows saturates to 448 either way. Returned as float32 bits; total =
// fl32(d * s_b) is then the float32 of the exact float64 product (24 bits times 4), a normal float32 or not (the
// caller checks: a subnormal or zero total takes nvfp4_scale's path).
constexpr uint32_t kNvfp4ExactAmaxBits = 0x01C00000u;  // 6 * 2^-126 = 1.5 * 2^-124
constexpr double kOneSixth = 1.0 / 6.0;                // fl64(1 / 6): E2M1's max, correctly rounded
AMPI_HD uint32_t nvfp4_block_scale_bits(uint32_t amax_b_bits, double decode_reciprocal) {
  const float per_six = divide_by_reciprocal(bits_as_float32(amax_b_bits), kOneSixth);
  return cast_abs_bits(float32_as_bits(divide_by_reciprocal(per_six, decode_reciprocal)), e4m3_grid());
}

// ---- the CUDA kernels' launch plan ----
// What the host hands the CUDA kernels of format readiness (readiness_kernels.cuh) for one call, the work geometry
// both sides agree on, and the launcher of their GPU build: shared by the host side (readiness_call.h, for the CUDA
// op and the emulated op) and the kernels (through nvcc, or through the host compiler with cuda_emu.h in front).
//
// Work geometry. Blocks of every recipe run along the last dimension, so the kernel walks rows. A lane holds
// kReadinessGroupElems (8) contiguous elements of one row (one 16-byte load of fp16/bf16, two of fp32): a
// 16-, 32- or 128-element block is then 2, 4 or 16 neighbouring lanes, and its amax is a butterfly of
// __shfl_xor_sync over them. A "task" is what one warp does in one step:
//   - a row of at least 32 groups (256 elements) is cut into tiles of 32 groups, one task per tile (256 is a
//     multiple of every block size, so no block straddles two tasks);
//   - shorter rows are packed, 32 / P rows per task, each row on P lanes, P the smallest power of two >= its
//     groups: rows start on lane multiples of P, so a butterfly over offsets < P never leaves its row, and a
//     row shorter than a block is that row's one (short) block.
// A row whose length is not a multiple of 8 ends in a lane holding fewer than 8 elements: the rest of its
// registers are +0, which adds nothing to any count or sum (0 quantizes to 0 with no error), and its blocks
// end where the row ends.
constexpr int kReadinessWarpLanes = 32;
constexpr int kReadinessGroupElems = 8;  // contiguous elements per lane
constexpr int64_t kReadinessTileGroups = kReadinessWarpLanes;  // groups of a row per task, for long rows
// Tasks per work chunk on the GPU: a block takes a contiguous run of chunks (never crossing a tensor), so the
// chunk is the unit work is dealt out in. 16 tasks are 2 per warp of a 256-thread block, at most 4096 elements.
constexpr int64_t kReadinessChunkTasks = 16;
// Tensors per launch, described in the kernel's own parameters (no device table to copy, so a call is also
// safe under CUDA graph capture); a call of more tensors takes several launches. 16 views keep the parameters
// well under the 4 KB every architecture and driver accepts.
constexpr int kReadinessInlineViews = 16;
// A call asks each recipe of the table at most once.
constexpr int kReadinessMaxRecipes = kNumRecipes;

// One nonempty tensor of a call, contiguous, with its work geometry.
struct ReadinessKernelView {
  const void* data;
  int64_t row_length;     // elements per row: the last dim (1 for a 0-d tensor)
  int64_t rows;           // numel / row_length
  int64_t tiles_per_row;  // tasks per row: ceil(groups / 32) when a row fills a warp, else 1
  int64_t rows_per_task;  // rows a task covers: 32 / lanes_per_row (1 when tiles_per_row > 1)
  int64_t tasks;          // warp tasks of the whole tensor
  int64_t first_chunk;    // its first chunk within its launch
  int64_t out_row;        // its row of the outputs
  int32_t lanes_per_row;  // P: lanes a row (or a tile of one) occupies, a power of two <= 32
  int32_t dtype;          // InputDtype: kFloat32, kFloat16 or kBFloat16
};

// Fills the geometry of a contiguous tensor of `numel` > 0 elements whose rows hold `row_length` > 0.
inline void set_readiness_geometry(ReadinessKernelView& v, int64_t numel, int64_t row_length) {
  v.row_length = row_length;
  v.rows = numel / row_length;
  const int64_t groups = (row_length + kReadinessGroupElems - 1) / kReadinessGroupElems;
  if (groups >= kReadinessTileGroups) {
    v.lanes_per_row = kReadinessWarpLanes;
    v.tiles_per_row = (groups + kReadinessTileGroups - 1) / kReadinessTileGroups;
    v.rows_per_task = 1;
    v.tasks = v.rows * v.tiles_per_row;
  } else {
    int32_t lanes = 1;
    while (lanes < groups) lanes *= 2;
    v.lanes_per_row = lanes;
    v.tiles_per_row = 1;
    v.rows_per_task = kReadinessWarpLanes / lanes;
    v.tasks = (v.rows + v.rows_per_task - 1) / v.rows_per_task;
  }
}

AMPI_HD int64_t readiness_chunks(const ReadinessKernelView& v, int64_t chunk_tasks) {
  return (v.tasks + chunk_tasks - 1) / chunk_tasks;
}

// One call, ready to launch.
struct ReadinessLaunchPlan {
  const ReadinessKernelView* views;  // host memory, the nonempty tensors grouped by dtype (one launch per run)
  int64_t num_views;
  int64_t num_tensors;  // rows of the outputs, empty tensors included
  int64_t chunk_tasks;
  int32_t num_recipes;
  int32_t slot_of_recipe[kReadinessMaxRecipes];  // output slot of each table recipe, -1 where not asked
  bool tensor_scaled_asked;  // a recipe that needs the tensor amax (Recipe.needs_tensor_amax) is asked
  const float* tensor_amax;  // device memory [T], or null: measured by the kernels
  // Outputs, device memory, zeroed (and amax filled) by the launch sequence.
  int64_t* counts;
  double* sums;
  float* amax;
};

// The GPU build of the kernels (readiness_cuda.cu, by nvcc), which the CUDA op calls: zeroes the outputs (or copies
// the given tensor amax), measures the tensor amax where the plan needs it first, and launches the quantization pass
// on `stream` (the device's current stream as the C shim hands it, a cudaStream_t). Asynchronous: no host sync.
void launch_format_readiness(const ReadinessLaunchPlan& plan, int device_index, void* stream);

}  // namespace amp_inspect
