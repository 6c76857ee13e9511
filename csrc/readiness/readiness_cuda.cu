// readiness_cuda.cu: the GPU build of format readiness's kernels (readiness_kernels.cuh) and the backend that
// launches them: memsets / a device-to-device copy for the outputs, grids sized from the occupancy API. The
// recipes' rules come from readiness.h, the code the CPU kernel runs; the same kernel source also runs on the
// CPU under tests (readiness_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_launch.cuh"
#include "readiness/readiness_cuda.h"
#include "readiness/readiness_kernels.cuh"

namespace amp_inspect {
namespace {

struct ReadinessCudaBackend {
  cudaStream_t stream;
  int device_index;

  void zero(void* at, int64_t bytes) { cuda_launch::zero_async(at, bytes, stream); }
  void copy(void* to, const void* from, int64_t bytes) {
    if (bytes > 0) {
      AMPI_CUDA_CHECK(cudaMemcpyAsync(to, from, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, stream));
    }
  }

  template <class Kernel>
  int64_t blocks(Kernel kernel, int64_t work) const {
    return cuda_launch::grid_for(kernel, readiness_kernels::kThreads, device_index, work);
  }

  template <class Kernel>
  void launch(Kernel kernel, int64_t grid, const readiness_kernels::ReadinessParams& params) {
    kernel<<<static_cast<unsigned int>(grid), readiness_kernels::kThreads, 0, stream>>>(params);
    AMPI_CUDA_CHECK(cudaGetLastError());
  }
};

}  // namespace

void launch_format_readiness(const ReadinessLaunchPlan& plan, int device_index, cudaStream_t stream) {
  ReadinessCudaBackend backend{stream, device_index};
  readiness_kernels::run_readiness(plan, backend);
}

}  // namespace amp_inspect
