// cuda_launch.cuh: what the GPU backends of the three ops (tensor_stats_cuda.cu, readiness_cuda.cu,
// update_stats_cuda.cu) share: a CUDA error raised as a std::runtime_error, which torch raises as RuntimeError,
// and the grid of a grid-stride kernel from the occupancy API. Light headers only (no torch, no c10: this is what
// C10_CUDA_CHECK did, without them).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#define AMPI_CUDA_CHECK(expr)                                                                                   \
  do {                                                                                                          \
    const cudaError_t ampi_error = (expr);                                                                      \
    if (ampi_error != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("amp_inspect: CUDA error: ") + cudaGetErrorString(ampi_error) + " (" \
                               #expr ")");                                                                      \
    }                                                                                                           \
  } while (false)

namespace amp_inspect::cuda_launch {

// Blocks of `threads` threads of `kernel` resident at once on a device (per SM, at least 1, times the SMs): asked
// of the occupancy API once per kernel and device, since each backend asks on every launch.
inline int64_t resident_blocks(const void* kernel, int threads, int device_index) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(device_index, kernel);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  int sms = 0;
  AMPI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0));
  AMPI_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index));
  const int64_t blocks = static_cast<int64_t>(per_sm < 1 ? 1 : per_sm) * (sms < 1 ? 1 : sms);
  cache.emplace(key, blocks);
  return blocks;
}

// The grid of a grid-stride kernel over `work` units (chunks, tasks): one block per unit, at most as many blocks as
// are resident at once (the rest loop).
template <class Kernel>
int64_t grid_for(Kernel kernel, int threads, int device_index, int64_t work) {
  const int64_t resident = resident_blocks(reinterpret_cast<const void*>(kernel), threads, device_index);
  return work < resident ? work : resident;
}

// `bytes` zero bytes at `at`, queued on `stream` (nothing for 0 bytes).
inline void zero_async(void* at, int64_t bytes, cudaStream_t stream) {
  if (bytes > 0) AMPI_CUDA_CHECK(cudaMemsetAsync(at, 0, static_cast<size_t>(bytes), stream));
}

}  // namespace amp_inspect::cuda_launch
