// update_stats_cuda.cu: the GPU build of update_stats' kernel (update_stats_kernels.cuh) and its launch: memsets for
// the outputs, grids sized from the occupancy API, all through common/cuda_launch.cuh's CudaBackend. The element
// logic comes from update_stats.h, the code the CPU kernel runs; the same kernel source also runs on the CPU under
// tests (update_stats_emu.cpp). Built without fast-math (float32 subnormals must survive).
#include "common/cuda_launch.cuh"
#include "update_stats/update_stats.h"
#include "update_stats/update_stats_kernels.cuh"

namespace amp_inspect {

void launch_update_stats(const UpdateLaunchPlan& plan, int device_index, void* stream) {
  cuda_launch::CudaBackend backend(stream, device_index);
  update_kernels::run_update_stats(plan, backend);
}

}  // namespace amp_inspect
