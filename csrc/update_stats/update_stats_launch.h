// update_stats_launch.h: the torch-free launch plan update_stats' CUDA kernel (update_stats_kernels.cuh) runs on,
// shared by the CUDA op, its nvcc-built launcher (declared here) and the emulated op.
#pragma once

#include <cstdint>

namespace amp_inspect {

// One nonempty tensor as the kernel reads it (update_stats_call.h's UpdateView, with its first chunk).
struct UpdateKernelView {
  const void* before;
  const void* after;
  const void* grad;
  const void* state;  // null: no exp_avg_sq
  int64_t numel;
  int64_t out_row;
  int64_t first_chunk;  // in the launch's chunks
  int32_t weight_dtype;
  int32_t grad_dtype;
  int32_t state_dtype;
};

constexpr int64_t kUpdateChunkElems = int64_t{1} << 16;  // the GPU's chunk: one block's work at a time
constexpr int kUpdateViewsPerLaunch = 24;  // 24 x 72 bytes of views: well inside the 4 KiB of kernel parameters

// The torch-free plan the host hands run_update_stats: all views, the outputs (device pointers), the chunk size.
struct UpdateLaunchPlan {
  const UpdateKernelView* views = nullptr;  // host memory; copied into the launches' parameters
  int64_t num_views = 0;
  int64_t num_tensors = 0;
  int64_t chunk_elems = 0;
  int64_t* counts = nullptr;  // [num_tensors, kUpdateCountColumns]
  double* sums = nullptr;     // [num_tensors, kUpdateSumColumns]
  float* amax = nullptr;      // [num_tensors]
};

// The GPU build of the kernel (update_stats_cuda.cu, by nvcc), which the CUDA op calls: zeroes the outputs and
// launches the kernel on `stream` (the device's current stream as the C shim hands it, a cudaStream_t; one launch per
// kUpdateViewsPerLaunch tensors). Asynchronous: no host sync.
void launch_update_stats(const UpdateLaunchPlan& plan, int device_index, void* stream);

}  // namespace amp_inspect
