// update_stats_emu_backend.h: update_stats' CUDA kernel (update_stats_kernels.cuh) on the CPU, through
// cuda_emu.h, and the backend update_kernels::run_update_stats launches it with (the emulated op's and the TSan
// driver's, tests/emu/update_tsan_driver.cpp). Torch-free. Include it after any torch header: the shim's macros
// must not meet them.
#pragma once

// No a*b+c contracted into one FMA: the kernel's float64 products and sums must round like the GPU's.
#pragma GCC optimize("fp-contract=off")

#include <cstring>

#include "common/cuda_emu.h"
#include "update_stats/update_stats_kernels.cuh"

namespace amp_inspect {

struct UpdateEmulatedBackend {
  int64_t blocks_override = 0;  // > 0: exactly this many blocks (more than the chunks on purpose: such blocks idle)

  void zero(void* at, int64_t bytes) {
    if (bytes > 0) std::memset(at, 0, static_cast<size_t>(bytes));
  }
  template <class Kernel>
  int64_t blocks(Kernel, int64_t work) const {
    constexpr int64_t kDefaultBlocks = 4;  // each block is 256 host threads: more would only be slower
    if (blocks_override > 0) return blocks_override;
    return work < kDefaultBlocks ? work : kDefaultBlocks;
  }
  template <class Kernel>
  void launch(Kernel kernel, int64_t grid, const update_kernels::UpdateParams& params) {
    if (grid > 0) cuda_emu::launch(grid, update_kernels::kThreads, kernel, params);
  }
};

}  // namespace amp_inspect
