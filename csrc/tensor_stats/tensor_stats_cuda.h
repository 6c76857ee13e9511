// tensor_stats_cuda.h: the torch-free interface between the CUDA op (tensor_stats_cuda_op.cpp, built by the
// host compiler) and the kernels (tensor_stats_cuda.cu, built by nvcc with light headers only).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "tensor_stats/tensor_stats_launch.h"

namespace amp_inspect {

// Zeroes the workspace and launches the statistics and finalize kernels on `stream`. Asynchronous: no host
// sync. Throws (std::runtime_error) when the GPU has no kernel image for this binary's architectures.
void launch_tensor_stats(const LaunchPlan& plan, int device_index, cudaStream_t stream);

// Whether this binary holds a kernel the device can run (a cubin of its architecture or PTX it can compile).
bool device_supported(int device_index);

}  // namespace amp_inspect
