// update_stats_cuda.h: the torch-free interface between update_stats' CUDA op (update_stats_cuda_op.cpp, built by
// the host compiler) and its kernel (update_stats_cuda.cu, built by nvcc with light headers only).
#pragma once

#include <cuda_runtime_api.h>

#include "update_stats/update_stats_launch.h"

namespace amp_inspect {

// Zeroes the outputs and launches the kernel on `stream` (one launch per kUpdateViewsPerLaunch tensors).
// Asynchronous: no host sync.
void launch_update_stats(const UpdateLaunchPlan& plan, int device_index, cudaStream_t stream);

}  // namespace amp_inspect
