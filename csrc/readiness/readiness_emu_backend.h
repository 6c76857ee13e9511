// readiness_emu_backend.h: the CUDA kernels of readiness_kernels.cuh on the CPU, through cuda_emu.h, and the
// backend readiness_kernels::run_readiness launches them with. Torch-free. Include it after any torch header:
// the shim's macros must not meet them.
#pragma once

// No a*b+c contracted into one FMA: the kernels' float math must round like the GPU's _rn intrinsics.
#pragma GCC optimize("fp-contract=off")

#include <cstring>

#include "common/cuda_emu.h"
#include "readiness/readiness_kernels.cuh"

namespace amp_inspect {

struct ReadinessEmulatedBackend {
  // Without an override, a launch gets as many blocks as its work, at most this many (each block is 256 host
  // threads, so more would only be slower).
  static constexpr int64_t kDefaultBlocks = 4;
  int64_t blocks_override = 0;  // > 0: exactly this many (more than the chunks on purpose: such blocks idle)

  void zero(void* at, int64_t bytes) {
    if (bytes > 0) std::memset(at, 0, static_cast<size_t>(bytes));
  }
  void copy(void* to, const void* from, int64_t bytes) {
    if (bytes > 0) std::memcpy(to, from, static_cast<size_t>(bytes));
  }

  template <class Kernel>
  int64_t blocks(Kernel, int64_t work) const {
    if (blocks_override > 0) return blocks_override;
    return work < kDefaultBlocks ? work : kDefaultBlocks;
  }

  template <class Kernel>
  void launch(Kernel kernel, int64_t grid, const readiness_kernels::ReadinessParams& params) {
    cuda_emu::launch(grid, readiness_kernels::kThreads, kernel, params);
  }
};

}  // namespace amp_inspect
