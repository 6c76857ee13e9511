// tensor_stats_cuda.cu: the GPU build of the kernels in tensor_stats_kernels.cuh and their launch: a memset of the
// workspace, the statistics kernels (one per dtype present) with grids sized from the occupancy API, and the
// finalize kernel above 16 tensors (below, the last stats block finalizes), all through common/cuda_launch.cuh's
// CudaBackend. The per-element tests come from tensor_stats.h, the same code the CPU kernel runs; the same kernel
// source also runs on the CPU under tests (tensor_stats_emu.cpp). Built without fast-math (float32 subnormals must
// survive).
#include <cuda_runtime.h>

#include "common/cuda_launch.cuh"
#include "tensor_stats/tensor_stats.h"
#include "tensor_stats/tensor_stats_kernels.cuh"

namespace amp_inspect {

void launch_tensor_stats(const LaunchPlan& plan, int device_index, void* stream) {
  cuda_launch::CudaBackend backend(stream, device_index);
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
