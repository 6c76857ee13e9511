// tensor_stats_cuda.cu: the GPU build of the kernels in tensor_stats_kernels.cuh and the backend that launches
// them: a memset of the workspace, the statistics kernels (one per dtype present) with grids sized from the
// occupancy API, and the finalize kernel above 16 tensors (below, the last stats block finalizes). The
// per-element tests come from tensor_stats.h, the same code the CPU kernel runs; the same kernel source also runs
// on the CPU under tests (tensor_stats_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common/cuda_launch.cuh"
#include "tensor_stats/tensor_stats_cuda.h"
#include "tensor_stats/tensor_stats_kernels.cuh"

namespace amp_inspect {
namespace {

constexpr int kMaxFinalizeBlocks = 1024;

struct CudaBackend {
  cudaStream_t stream;
  int device_index;

  void zero(int64_t* words, int64_t count) {
    cuda_launch::zero_async(words, count * static_cast<int64_t>(sizeof(int64_t)), stream);
  }

  template <class Kernel>
  int64_t stats_blocks(Kernel kernel, int64_t chunks) const {
    return cuda_launch::grid_for(kernel, kernels::kThreads, device_index, chunks);
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
