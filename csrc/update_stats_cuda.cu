// update_stats_cuda.cu: the GPU build of update_stats' kernel (update_stats_kernels.cuh) and the backend that
// launches it: memsets for the outputs, grids sized from the occupancy API. The element logic comes from
// update_stats.h, the code the CPU kernel runs; the same kernel source also runs on the CPU under tests
// (update_stats_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "update_stats_cuda.h"
#include "update_stats_kernels.cuh"

#define AMPI_UPDATE_CUDA_CHECK(expr)                                                                            \
  do {                                                                                                          \
    const cudaError_t ampi_error = (expr);                                                                      \
    if (ampi_error != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("amp_inspect: CUDA error: ") + cudaGetErrorString(ampi_error) + " (" \
                               #expr ")");                                                                      \
    }                                                                                                           \
  } while (false)

namespace amp_inspect {
namespace {

// Resident blocks of the kernel on a device (per SM times the SMs): asked once per device.
int64_t resident_blocks(const void* kernel, int device_index) {
  static std::mutex mutex;
  static std::unordered_map<int, int64_t> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device_index);
  if (it != cache.end()) return it->second;
  int per_sm = 0;
  int sms = 0;
  AMPI_UPDATE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, update_kernels::kThreads, 0));
  AMPI_UPDATE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_index));
  const int64_t blocks = static_cast<int64_t>(per_sm < 1 ? 1 : per_sm) * (sms < 1 ? 1 : sms);
  cache[device_index] = blocks;
  return blocks;
}

struct UpdateCudaBackend {
  cudaStream_t stream;
  int device_index;

  void zero(void* at, int64_t bytes) {
    if (bytes > 0) AMPI_UPDATE_CUDA_CHECK(cudaMemsetAsync(at, 0, static_cast<size_t>(bytes), stream));
  }
  template <class Kernel>
  int64_t blocks(Kernel kernel, int64_t work) const {
    const int64_t resident = resident_blocks(reinterpret_cast<const void*>(kernel), device_index);
    return work < resident ? work : resident;
  }
  template <class Kernel>
  void launch(Kernel kernel, int64_t grid, const update_kernels::UpdateParams& params) {
    if (grid <= 0) return;
    kernel<<<static_cast<unsigned int>(grid), update_kernels::kThreads, 0, stream>>>(params);
    AMPI_UPDATE_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void launch_update_stats(const UpdateLaunchPlan& plan, int device_index, cudaStream_t stream) {
  UpdateCudaBackend backend{stream, device_index};
  update_kernels::run_update_stats(plan, backend);
}

}  // namespace amp_inspect
