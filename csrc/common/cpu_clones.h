// cpu_clones.h: what the vectorised CPU kernels (readiness_cpu.cpp, update_stats_cpu.cpp) share to pick their
// instruction sets: the clone attribute of their hot loops and which clone this CPU runs.
//
// Include it after the file's `#pragma GCC optimize("no-trapping-math")` (that pragma must come before every header:
// see either kernel's top comment).
#pragma once

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

}  // namespace amp_inspect
