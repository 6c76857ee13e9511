// readiness_cuda.cu: the GPU build of format readiness's kernels (readiness_kernels.cuh) and the backend that
// launches them: memsets / a device-to-device copy for the outputs, grids sized from the occupancy API. The
// recipes' rules come from readiness.h, the code the CPU kernel runs; the same kernel source also runs on the
// CPU under tests (readiness_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "readiness_cuda.h"
#include "readiness_kernels.cuh"

#define AMPI_READINESS_CUDA_CHECK(expr)                                                                         \
  do {                                                                                                          \
    const cudaError_t ampi_error = (expr);                                                                      \
    if (ampi_error != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("amp_inspect: CUDA error: ") + cudaGetErrorString(ampi_error) + " (" \
                               #expr ")");                                                                      \
    }                                                                                                           \
  } while (false)

namespace amp_inspect {
namespace {

// Resident blocks per SM of a kernel on a device, times the SMs: asked once per kernel and device.
int64_t resident_blocks(const void* kernel, int device_index) {
  static std::mutex mutex;
  static std::unordered_map<const void*, int64_t> cache[64];
  const int slot = device_index >= 0 && device_index < 64 ? device_index : 0;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache[slot].find(kernel);
  if (it != cache[slot].end()) return it->second;
  int per_sm = 0;
  int sms = 0;
  AMPI_READINESS_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, readiness_kernels::kThreads, 0));
  AMPI_READINESS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index));
  const int64_t blocks = static_cast<int64_t>(per_sm < 1 ? 1 : per_sm) * (sms < 1 ? 1 : sms);
  cache[slot][kernel] = blocks;
  return blocks;
}

struct ReadinessCudaBackend {
  cudaStream_t stream;
  int device_index;

  void zero(void* at, int64_t bytes) {
    if (bytes > 0) AMPI_READINESS_CUDA_CHECK(cudaMemsetAsync(at, 0, static_cast<size_t>(bytes), stream));
  }
  void copy(void* to, const void* from, int64_t bytes) {
    if (bytes > 0) {
      AMPI_READINESS_CUDA_CHECK(
          cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
  }

  template <class Kernel>
  int64_t blocks(Kernel kernel, int64_t work) const {
    const int64_t resident = resident_blocks(reinterpret_cast<const void*>(kernel), device_index);
    return work < resident ? work : resident;
  }

  template <class Kernel>
  void launch(Kernel kernel, int64_t grid, const readiness_kernels::ReadinessParams& params) {
    kernel<<<static_cast<unsigned int>(grid), readiness_kernels::kThreads, 0, stream>>>(params);
    AMPI_READINESS_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void launch_format_readiness(const ReadinessLaunchPlan& plan, int device_index, cudaStream_t stream) {
  ReadinessCudaBackend backend{stream, device_index};
  readiness_kernels::run_readiness(plan, backend);
}

}  // namespace amp_inspect
