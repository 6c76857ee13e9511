// warp_reduce.cuh: a warp's sum and unsigned maximum by shuffles, for every op's CUDA kernels, written once for the two
// compilers of kernel source (nvcc, and the host compiler with cuda_emu.h in front). Lane 0 ends with the warp's
// value; every lane of the warp must call them (a full-warp shuffle).
#pragma once

#include <cstdint>

#include "common/dtype_load.cuh"  // the namespace that keeps the GPU build's symbols apart from the emulation's

namespace amp_inspect {
inline namespace AMPI_KERNELS_NAMESPACE {

constexpr int kWarpSize = 32;
constexpr unsigned int kFullWarpMask = 0xFFFFFFFFu;

__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

template <typename V>
__device__ __forceinline__ V warp_sum(V value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_down_sync(kFullWarpMask, value, offset);
  return value;
}

__device__ __forceinline__ uint32_t warp_max(uint32_t value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = max_u32(value, __shfl_down_sync(kFullWarpMask, value, offset));
  }
  return value;
}

}  // namespace AMPI_KERNELS_NAMESPACE
}  // namespace amp_inspect
