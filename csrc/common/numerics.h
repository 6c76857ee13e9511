// numerics.h: what every op's element logic shares, written once for CPU and CUDA: the input dtypes, the
// float32 / float64 bit-pattern constants, the bit casts and the exact widening of every input dtype to
// float32 bits.
//
// Everything here is torch-free and works on bit patterns with integer operations: exact, and immune to
// flush-to-zero / denormals-are-zero modes (never build this with fast-math). The CPU kernels and the CUDA
// kernels (through nvcc, or through the host compiler with cuda_emu.h in front) all include it, so the CPU tests
// exercise the very operations the GPU runs. Each op's own element logic is its folder's <op>.h
// (tensor_stats/tensor_stats.h: the format thresholds; readiness/readiness.h; update_stats/update_stats.h).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define AMPI_HD __host__ __device__ __forceinline__
#else
#define AMPI_HD inline
#endif

namespace amp_inspect {

// Input dtypes the kernels read; the host code maps torch dtypes onto these (common/op.h input_dtype_of).
enum InputDtype : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2, kFloat64 = 3 };

// float32 bit-pattern constants.
constexpr uint32_t kSignMask32 = 0x80000000u;
constexpr uint32_t kAbsMask32 = 0x7FFFFFFFu;
constexpr uint32_t kInfBits32 = 0x7F800000u;  // |bits| above this is NaN
constexpr uint32_t kNegInfBits32 = 0xFF800000u;
constexpr int kExponentShift32 = 23;
constexpr uint32_t kExponentMask32 = 0xFFu;
constexpr int kMantissaBits32 = 23;
constexpr uint32_t kMantissaMask32 = 0x007FFFFFu;
constexpr uint32_t kImplicitBit32 = 0x00800000u;  // also the smallest normal float32's bits
constexpr int kExponentBias32 = 127;

// binary16 (fp16) and bfloat16 bit-pattern constants: |bits| and each format's +Inf (|bits| above it is NaN). The
// magnitudes of one 16-bit format order as their values do.
constexpr uint32_t kAbsMask16 = 0x7FFFu;
constexpr uint32_t kFp16InfBits = 0x7C00u;
constexpr uint32_t kBf16InfBits = 0x7F80u;

// float64 bit-pattern constants.
constexpr uint64_t kAbsMask64 = 0x7FFFFFFFFFFFFFFFull;
constexpr uint64_t kInfBits64 = 0x7FF0000000000000ull;
constexpr uint64_t kNegInfBits64 = 0xFFF0000000000000ull;
constexpr int kMantissaBits64 = 52;
constexpr uint64_t kMantissaMask64 = 0x000FFFFFFFFFFFFFull;
constexpr int kExponentBias64 = 1023;

// ---- bit casts ----

AMPI_HD float bits_as_float32(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

AMPI_HD uint32_t float32_as_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t bits;
  __builtin_memcpy(&bits, &f, sizeof bits);
  return bits;
#endif
}

AMPI_HD double bits_as_float64(uint64_t bits) {
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  __builtin_memcpy(&d, &bits, sizeof d);
  return d;
#endif
}

AMPI_HD uint64_t float64_as_bits(double d) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint64_t>(__double_as_longlong(d));
#else
  uint64_t bits;
  __builtin_memcpy(&bits, &d, sizeof bits);
  return bits;
#endif
}

// ---- element loading: every 16-bit input dtype becomes float32 bits without touching the FPU ----
// (the CUDA kernels' loaders by storage word are common/dtype_load.cuh; the CPU kernels' block loaders,
// common/cpu_clones.h)

AMPI_HD uint32_t bf16_to_f32_bits(uint16_t h) { return static_cast<uint32_t>(h) << 16; }

// Exact fp16 -> float32, branch-free so the CPU loop vectorises. Normal halves, Inf and NaN (payload kept)
// are re-biased on the bits. A subnormal half is mantissa * 2^-24: the int -> float conversion and the
// product are exact and their results normal float32, so no flush-to-zero mode can alter them.
AMPI_HD uint32_t fp16_to_f32_bits(uint16_t h) {
  constexpr uint32_t kRebias = (127 - 15) << kExponentShift32;          // normal halves
  constexpr uint32_t kRebiasInfNan = (255 - 31) << kExponentShift32;    // exponent 31 -> 255
  constexpr float kHalfSubnormalUnit = 5.9604644775390625e-08f;         // 2^-24
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t magnitude = h & 0x7FFFu;
  const uint32_t exponent = magnitude >> 10;
  const uint32_t normal = (magnitude << 13) + (exponent == 0x1Fu ? kRebiasInfNan : kRebias);
  const uint32_t subnormal = float32_as_bits(static_cast<float>(magnitude) * kHalfSubnormalUnit);
  return sign | (exponent == 0 ? subnormal : normal);
}

// ---- float32 rounding without the FPU's flush-to-zero ----
// The CPU may run with flush-to-zero / denormals-are-zero on (torch.set_flush_denormal(True)); the GPU's
// __fmul_rn and __double2float_rn never flush. These give the GPU's results on the host in any mode.

// float64 bits rounded to the nearest float32 (ties to even), as bits, subnormal results included.
AMPI_HD uint32_t float64_bits_to_float32_bits(uint64_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits >> 63) << 31;
  const uint64_t magnitude = bits & kAbsMask64;
  if (magnitude >= kInfBits64) {  // Inf, or NaN kept quiet with the top of its payload
    const uint64_t payload = magnitude & kMantissaMask64;
    return sign | kInfBits32 | (payload != 0 ? 0x00400000u | static_cast<uint32_t>(payload >> 29) : 0u);
  }
  const int exponent = static_cast<int>(magnitude >> kMantissaBits64);
  if (exponent == 0) return sign;  // zero, or a float64 subnormal: far below half the smallest float32
  // The float32 biased exponent; at or below 0 the result is a float32 subnormal (more bits shifted out).
  const int biased32 = exponent - kExponentBias64 + kExponentBias32;
  if (biased32 >= static_cast<int>(kExponentMask32)) return sign | kInfBits32;
  const uint64_t significand = (magnitude & kMantissaMask64) | (1ull << kMantissaBits64);  // 53 bits
  const int shift = (kMantissaBits64 - kMantissaBits32) + (biased32 <= 0 ? 1 - biased32 : 0);
  if (shift > kMantissaBits64 + 1) return sign;  // below half the smallest subnormal: rounds to zero
  uint64_t kept = significand >> shift;
  const uint64_t rest = significand & ((1ull << shift) - 1), half = 1ull << (shift - 1);
  if (rest > half || (rest == half && (kept & 1u))) ++kept;  // a carry moves into the exponent field, as it should
  if (biased32 <= 0) return sign | static_cast<uint32_t>(kept);
  return sign | ((static_cast<uint32_t>(biased32 - 1) << kExponentShift32) + static_cast<uint32_t>(kept));
}

// float32 bits as a float64, exactly, in integer arithmetic (a conversion instruction reads a subnormal as zero
// under denormals-are-zero).
AMPI_HD double float32_bits_as_float64(uint32_t bits) {
  const uint64_t sign = static_cast<uint64_t>(bits & kSignMask32) << 32;
  const uint32_t magnitude = bits & kAbsMask32;
  if (magnitude == 0) return bits_as_float64(sign);
  if (magnitude >= kInfBits32) {  // Inf and NaN: the exponent field all ones, the payload moved up
    return bits_as_float64(sign | kInfBits64 | (static_cast<uint64_t>(magnitude & kMantissaMask32) << 29));
  }
  int exponent = static_cast<int>(magnitude >> kExponentShift32);
  uint64_t mantissa = magnitude & kMantissaMask32;
  if (exponent == 0) {  // subnormal: normalise (every float32 is a normal float64)
    exponent = 1;
    while ((mantissa & kImplicitBit32) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    mantissa &= kMantissaMask32;
  }
  const uint64_t biased64 = static_cast<uint64_t>(exponent - kExponentBias32 + kExponentBias64);
  return bits_as_float64(sign | (biased64 << kMantissaBits64) | (mantissa << 29));
}

// float32(bits) * scale rounded as one float32 multiply (__fmul_rn), in any flush-to-zero mode. The hardware
// product is kept when neither it nor the input can be subnormal (the common case); otherwise the product is
// taken exactly in float64 (24 + 24 bits, far inside its normal range) and rounded once to float32.
AMPI_HD uint32_t scaled_float32_bits(uint32_t bits, float scale) {
  const uint32_t product = float32_as_bits(bits_as_float32(bits) * scale);
  const uint32_t product_exponent = (product & kAbsMask32) >> kExponentShift32;
  const uint32_t scale_exponent = (float32_as_bits(scale) & kAbsMask32) >> kExponentShift32;
  if (product_exponent > 1 && (bits & kAbsMask32) >= kImplicitBit32 && scale_exponent != 0) return product;
  const double exact = float32_bits_as_float64(bits) * float32_bits_as_float64(float32_as_bits(scale));
  return float64_bits_to_float32_bits(float64_as_bits(exact));
}

// ---- per-element tests on |bits| ----

AMPI_HD bool is_finite32(uint32_t abs_bits) { return abs_bits < kInfBits32; }
AMPI_HD bool is_finite64(uint64_t abs_bits) { return abs_bits < kInfBits64; }

}  // namespace amp_inspect
