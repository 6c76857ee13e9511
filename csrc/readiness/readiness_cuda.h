// readiness_cuda.h: the torch-free interface between format readiness's CUDA op (readiness_cuda_op.cpp, built by
// the host compiler) and its kernels (readiness_cuda.cu, built by nvcc with light headers only).
#pragma once

#include <cuda_runtime_api.h>

#include "readiness/readiness_launch.h"

namespace amp_inspect {

// Zeroes the outputs (or copies the given tensor amax), measures the tensor amax where the plan needs it first,
// and launches the quantization pass on `stream`. Asynchronous: no host sync.
void launch_format_readiness(const ReadinessLaunchPlan& plan, int device_index, cudaStream_t stream);

}  // namespace amp_inspect
