// tensor_stats_cuda.cu: the GPU build of the kernels in tensor_stats_kernels.cuh and the backend that launches
// them: a memset of the workspace, the statistics kernels (one per dtype present) with grids sized from the
// occupancy API, and the finalize kernel above 16 tensors (below, the last stats block finalizes). The
// per-element tests come from numerics.h, the same code the CPU kernel runs; the same kernel source also runs
// on the CPU under tests (tensor_stats_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "tensor_stats_cuda.h"
#include "tensor_stats_kernels.cuh"

// A CUDA error as a std::runtime_error, which torch raises as RuntimeError (no torch header here: light
// headers only in .cu files; this is what C10_CUDA_CHECK did, without c10).
#define AMPI_CUDA_CHECK(expr)                                                                                   \
  do {                                                                                                          \
    const cudaError_t ampi_error = (expr);                                                                      \
    if (ampi_error != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("amp_inspect: CUDA error: ") + cudaGetErrorString(ampi_error) + " (" \
                               #expr ")");                                                                      \
    }                                                                                                           \
  } while (false)

namespace amp_inspect {
namespace {

constexpr int kMaxFinalizeBlocks = 1024;

int multiprocessor_count(int device_index) {
  int count = 0;
  AMPI_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device_index));
  return count;
}

// Resident blocks per SM of a kernel on a device, from the occupancy API; asked once per kernel and device.
int resident_blocks_per_sm(const void* kernel, int device_index) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int> cache[64];
  const int slot = device_index >= 0 && device_index < 64 ? device_index : 0;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache[slot].find(kernel);
  if (it != cache[slot].end()) return it->second;
  int blocks = 0;
  AMPI_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kernels::kThreads, 0));
  if (blocks < 1) blocks = 1;
  cache[slot][kernel] = blocks;
  return blocks;
}

struct CudaBackend {
  cudaStream_t stream;
  int device_index;

  void zero(int64_t* words, int64_t count) {
    AMPI_CUDA_CHECK(cudaMemsetAsync(words, 0, static_cast<size_t>(count) * sizeof(int64_t), stream));
  }

  template <class Kernel>
  int64_t stats_blocks(Kernel kernel, int64_t chunks) const {
    const int64_t resident = static_cast<int64_t>(multiprocessor_count(device_index)) *
                             resident_blocks_per_sm(reinterpret_cast<const void*>(kernel), device_index);
    return chunks < resident ? chunks : resident;
  }

  template <class Kernel>
  void launch_stats(Kernel kernel, int64_t grid, const kernels::StatsParams& params) {
    kernel<<<static_cast<unsigned int>(grid), kernels::kThreads, 0, stream>>>(params);
    AMPI_CUDA_CHECK(cudaGetLastError());
  }

  int64_t finalize_blocks(int64_t rows) const { return rows < kMaxFinalizeBlocks ? rows : kMaxFinalizeBlocks; }

  void launch_finalize(int64_t grid, const kernels::FinalizeParams& params) {
    kernels::finalize_kernel<<<static_cast<unsigned int>(grid), kernels::kFinalizeThreads, 0, stream>>>(params);
    AMPI_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void launch_tensor_stats(const LaunchPlan& plan, int device_index, cudaStream_t stream) {
  CudaBackend backend{stream, device_index};
  kernels::run_stats(plan, backend);
}

bool device_supported(int device_index) {
  // cudaFuncGetAttributes fails with cudaErrorNoKernelImageForDevice (or InvalidDeviceFunction) when no
  // image of the kernel fits the device; the error is cleared so later calls do not see it.
  int previous = 0;
  AMPI_CUDA_CHECK(cudaGetDevice(&previous));
  AMPI_CUDA_CHECK(cudaSetDevice(device_index));
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, kernels::finalize_kernel);
  (void)cudaGetLastError();
  AMPI_CUDA_CHECK(cudaSetDevice(previous));
  return status == cudaSuccess;
}

}  // namespace amp_inspect
