// update_stats_cuda.cu: the GPU build of update_stats' kernel (update_stats_kernels.cuh) and the backend that
// launches it: memsets for the outputs, grids sized from the occupancy API. The element logic comes from
// update_stats.h, the code the CPU kernel runs; the same kernel source also runs on the CPU under tests
// (update_stats_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include <cuda_runtime.h>

#include "common/cuda_launch.cuh"
#include "update_stats/update_stats_cuda.h"
#include "update_stats/update_stats_kernels.cuh"

namespace amp_inspect {
namespace {

struct UpdateCudaBackend {
  cudaStream_t stream;
  int device_index;

  void zero(void* at, int64_t bytes) { cuda_launch::zero_async(at, bytes, stream); }
  template <class Kernel>
  int64_t blocks(Kernel kernel, int64_t work) const {
    return cuda_launch::grid_for(kernel, update_kernels::kThreads, device_index, work);
  }
  template <class Kernel>
  void launch(Kernel kernel, int64_t grid, const update_kernels::UpdateParams& params) {
    if (grid <= 0) return;
    kernel<<<static_cast<unsigned int>(grid), update_kernels::kThreads, 0, stream>>>(params);
    AMPI_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void launch_update_stats(const UpdateLaunchPlan& plan, int device_index, cudaStream_t stream) {
  UpdateCudaBackend backend{stream, device_index};
  update_kernels::run_update_stats(plan, backend);
}

}  // namespace amp_inspect
