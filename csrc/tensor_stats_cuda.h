// tensor_stats_cuda.h: the torch-free interface between the CUDA op (tensor_stats_cuda_op.cpp, built by the
// host compiler) and the kernels (tensor_stats_cuda.cu, built by nvcc with light headers only).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "numerics.h"

namespace amp_inspect {

// Elements per work chunk on CUDA: one block handles one chunk at a time.
constexpr int64_t kCudaChunkElems = int64_t{1} << 14;

struct CudaStatsArgs {
  const TensorView* views;  // device memory: the tensor table, one entry per nonempty tensor
  int64_t num_views;
  int64_t num_tensors;
  int64_t total_chunks;
  FormatBounds bounds[kMaxFormats];
  int32_t num_formats;
  int32_t has_scale;
  float scale_value;
  const float* scale_ptr;  // device memory, or null to use scale_value
  // unscale_stats_: after counting, x is overwritten with x * *inv_scale (float32 math rounded to the dtype,
  // float64 math for float64) and *found_inf set to 1 when a row has NaN/Inf. Null inv_scale: no writes.
  const float* inv_scale;
  float* found_inf;
  // Outputs, zero-filled (amin_nonzero +inf) before the launch. `counts` holds the raw threshold counts
  // (RawCounts layout, see kRawColumns) until the finalize kernel turns them into the user's counts.
  int64_t* counts;
  int64_t* hist;
  float* amax;
  float* amin_nonzero;
  double* sumsq;
};

// Launches the statistics pass and the finalize pass on `stream`. Asynchronous: no host sync.
void launch_tensor_stats(const CudaStatsArgs& args, int device_index, cudaStream_t stream);

}  // namespace amp_inspect
