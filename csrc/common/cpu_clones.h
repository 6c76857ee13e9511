// cpu_clones.h: what the vectorised CPU kernels (tensor_stats_cpu.cpp, readiness_cpu.cpp, update_stats_cpu.cpp)
// share: the clone attribute of their hot loops, which clone this CPU runs, and the loops that widen a block of
// 16-bit inputs to float32 bits (written once: exact, on the bits, common/numerics.h).
//
// In a kernel built with `#pragma GCC optimize("no-trapping-math")` (readiness_cpu.cpp, update_stats_cpu.cpp),
// include it after the pragma (which must come before every header: see either kernel's top comment).
#pragma once

#include <cstdint>
#include <cstring>

#include "common/numerics.h"

// The vectorised loops, cloned for AVX-512 and AVX2 besides the baseline; GCC's dispatch picks one at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AMPI_CPU_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define AMPI_CPU_CLONES
#endif

namespace amp_inspect {

// Whether this CPU runs the AVX-512 clones (GCC's dispatch picks arch=x86-64-v4 where all these features are), whose
// float64 lanes are best one 8-double register wide; elsewhere a 64-byte vector type goes through the stack, and the
// kernels keep their lanes as 2-double pairs.
inline bool wide_lanes() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  static const bool wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                           __builtin_cpu_supports("avx512cd");
  return wide;
#else
  return false;
#endif
}

// ---- 16-bit inputs widened to float32 bits, a contiguous run at a time ----
// In an unnamed namespace: each kernel compiles its own copy under its own options (no-trapping-math where it sets
// it), as when each kernel held its own.
namespace {

// bfloat16 is the top half of a float32: a shift, vectorised per clone.
AMPI_CPU_CLONES inline void widen_bf16(const uint16_t* __restrict p, int64_t n, uint32_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32_bits(p[i]);
}
// float16 on the bits: exact whatever the FTZ mode (numerics.h).
AMPI_CPU_CLONES inline void widen_fp16(const uint16_t* __restrict p, int64_t n, uint32_t* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_f32_bits(p[i]);
}

// Elements [start, start + n) of an array of `dtype` (float32, bfloat16 or float16) as float32 bits, copied into
// `out`.
inline void load_f32_bits(const void* data, int32_t dtype, int64_t start, int64_t n, uint32_t* out) {
  switch (dtype) {
    case kFloat32:
      std::memcpy(out, static_cast<const uint32_t*>(data) + start, sizeof(uint32_t) * n);
      break;
    case kBFloat16:
      widen_bf16(static_cast<const uint16_t*>(data) + start, n, out);
      break;
    default:
      widen_fp16(static_cast<const uint16_t*>(data) + start, n, out);
      break;
  }
}

// The same elements as float32 bits where they lie: float32 read in place, 16-bit widened into `stage`.
inline const uint32_t* f32_bits_in_place(const void* data, int32_t dtype, int64_t start, int64_t n, uint32_t* stage) {
  switch (dtype) {
    case kFloat32:
      return static_cast<const uint32_t*>(data) + start;
    case kBFloat16:
      widen_bf16(static_cast<const uint16_t*>(data) + start, n, stage);
      return stage;
    default:
      widen_fp16(static_cast<const uint16_t*>(data) + start, n, stage);
      return stage;
  }
}

}  // namespace
}  // namespace amp_inspect
