// dtype_load.cuh: how every op's CUDA kernels read their inputs, written once for the two compilers of kernel
// source (nvcc, and the host compiler with cuda_emu.h in front): the storage word of each input dtype and its float32
// bits, by a dtype known at compile time (the kernels compiled per dtype) or at run time, and the words of a
// 16-byte vector load. Also the namespace that keeps the GPU build's symbols apart from the emulation's.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#include "common/numerics.h"

// The GPU build and the CPU emulation must not share symbol names: both may be linked into one library.
// cuda_emu.h defines it as host_emulation; each op's kernels open `inline namespace AMPI_KERNELS_NAMESPACE`.
#if !defined(AMPI_KERNELS_NAMESPACE)
#define AMPI_KERNELS_NAMESPACE gpu
#endif

namespace amp_inspect {
inline namespace AMPI_KERNELS_NAMESPACE {

// Storage word of each input dtype.
template <int kDtype>
struct Storage;
template <>
struct Storage<kFloat32> {
  using type = uint32_t;
};
template <>
struct Storage<kFloat16> {
  using type = uint16_t;
};
template <>
struct Storage<kBFloat16> {
  using type = uint16_t;
};
template <>
struct Storage<kFloat64> {
  using type = uint64_t;
};

// float32 bits of a stored word: exact for fp32, fp16 (subnormals included) and bf16; rounded once for fp64.
template <int kDtype>
__device__ __forceinline__ uint32_t stored_as_f32_bits(typename Storage<kDtype>::type raw) {
  if constexpr (kDtype == kFloat32) {
    return raw;
  } else if constexpr (kDtype == kFloat16) {
    return __float_as_uint(__half2float(__ushort_as_half(raw)));  // HADD2.F32: exact, subnormals included
  } else if constexpr (kDtype == kBFloat16) {
    return bf16_to_f32_bits(raw);
  } else {
    return __float_as_uint(__double2float_rn(__longlong_as_double(static_cast<long long>(raw))));
  }
}

// Storage word i of a 16-byte vector held in registers (i known at compile time once unrolled): taken out of the
// components with shifts, since a union or a cast would send the vector to local memory.
template <typename W>
__device__ __forceinline__ W vector_word(const uint4& v, int i) {
  static_assert(sizeof(W) == 4 || sizeof(W) == 2, "vector_word reads 4- and 2-byte words");
  constexpr int kPerComponent = 4 / static_cast<int>(sizeof(W));
  const int c = i / kPerComponent;
  const uint32_t component = c == 0 ? v.x : (c == 1 ? v.y : (c == 2 ? v.z : v.w));
  if constexpr (sizeof(W) == 4) {
    return component;
  } else {
    return static_cast<W>(component >> (16 * (i % 2)));
  }
}

// float32 bits of element i of an array of `dtype` (float32, float16 or bfloat16) chosen at run time: exact, on the
// bits (common/numerics.h), for kernels that read several inputs of independent dtypes.
__device__ __forceinline__ uint32_t load_as_f32_bits(const void* data, int32_t dtype, int64_t i) {
  if (dtype == kFloat32) return static_cast<const uint32_t*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  return dtype == kBFloat16 ? bf16_to_f32_bits(h) : fp16_to_f32_bits(h);
}

}  // namespace AMPI_KERNELS_NAMESPACE
}  // namespace amp_inspect
