// readiness_cuda.cu: the GPU build of format readiness's kernels (readiness_kernels.cuh) and their launch: memsets
// / a device-to-device copy for the outputs, grids sized from the occupancy API, all through common/cuda_launch.cuh's
// CudaBackend. The recipes' rules come from readiness.h, the code the CPU kernel runs; the same kernel source also
// runs on the CPU under tests (readiness_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include "common/cuda_launch.cuh"
#include "readiness/readiness.h"
#include "readiness/readiness_kernels.cuh"

namespace amp_inspect {

void launch_format_readiness(const ReadinessLaunchPlan& plan, int device_index, void* stream) {
  cuda_launch::CudaBackend backend(stream, device_index);
  readiness_kernels::run_readiness(plan, backend);
}

}  // namespace amp_inspect
