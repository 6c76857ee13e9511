// cuda_launch.cuh: what the GPU builds of every op's kernels (tensor_stats_cuda.cu, readiness_cuda.cu,
// update_stats_cuda.cu) share: a CUDA error raised as a std::runtime_error, which torch raises as RuntimeError, the
// grid of a grid-stride kernel from the occupancy API, and CudaBackend, which every op's launch sequence runs its
// kernels with (cuda_emu.h's Backend is the same on the CPU). Light headers only (no torch, no c10: this is what
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

// What an op's launch sequence (run_* in its kernels .cuh, written once for the GPU and the emulation) runs its
// kernels with on a GPU: everything queued on one stream, asynchronous (no host sync). cuda_emu::Backend offers the
// same calls on the CPU.
//   zero(at, bytes), copy(to, from, bytes)  device memory
//   blocks(kernel, threads, work)           the grid of a grid-stride kernel over `work` units (chunks, tasks)
//   blocks_up_to(work, most)                the grid of a kernel that covers `work` units with at most `most` blocks
//   launch(kernel, grid, threads, params)   one launch (none for an empty grid)
struct CudaBackend {
  cudaStream_t stream;
  int device_index;

  // `stream` as the C shim hands it (aoti_torch_get_current_cuda_stream): a cudaStream_t.
  CudaBackend(void* stream, int device_index) : stream(static_cast<cudaStream_t>(stream)), device_index(device_index) {}

  void zero(void* at, int64_t bytes) { zero_async(at, bytes, stream); }
  void copy(void* to, const void* from, int64_t bytes) {
    if (bytes > 0) {
      AMPI_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
  }

  template <class Kernel>
  int64_t blocks(Kernel kernel, int threads, int64_t work) const {
    return grid_for(kernel, threads, device_index, work);
  }
  int64_t blocks_up_to(int64_t work, int64_t most) const { return work < most ? work : most; }

  template <class Kernel, class Params>
  void launch(Kernel kernel, int64_t grid, int threads, const Params& params) {
    if (grid <= 0) return;
    kernel<<<static_cast<unsigned int>(grid), threads, 0, stream>>>(params);
    AMPI_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace amp_inspect::cuda_launch
