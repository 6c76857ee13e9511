// tensor_stats_emu_backend.h: the CUDA kernels of tensor_stats_kernels.cuh on the CPU, through cuda_emu.h, and
// the backend kernels::run_stats launches them with. Torch-free: used by the emulated op (tensor_stats_emu.cpp)
// and by the ThreadSanitizer driver (tests/emu/tsan_driver.cpp, `make test-emu-tsan`). Include it after any
// torch header: the shim's macros must not meet them.
#pragma once

// No a*b+c contracted into one FMA: the kernels' float math must round like the GPU's _rn intrinsics.
#pragma GCC optimize("fp-contract=off")

#include <cstring>

#include "common/cuda_emu.h"
#include "tensor_stats/tensor_stats_kernels.cuh"

namespace amp_inspect {

struct EmulatedBackend {
  // Without an override, a launch gets as many blocks as chunks, at most this many (each block is 256 host
  // threads, so more would only be slower).
  static constexpr int64_t kDefaultBlocks = 4;
  int64_t blocks = 0;  // > 0: exactly this many (more than the chunks on purpose: such blocks find no work)

  void zero(int64_t* words, int64_t count) { std::memset(words, 0, static_cast<size_t>(count) * sizeof(int64_t)); }

  template <class Kernel>
  int64_t stats_blocks(Kernel, int64_t chunks) const {
    if (blocks > 0) return blocks;
    return chunks < kDefaultBlocks ? chunks : kDefaultBlocks;
  }

  template <class Kernel>
  void launch_stats(Kernel kernel, int64_t grid, const kernels::StatsParams& params) {
    cuda_emu::launch(grid, kernels::kThreads, kernel, params);
  }

  int64_t finalize_blocks(int64_t rows) const { return rows < 2 ? rows : 2; }

  void launch_finalize(int64_t grid, const kernels::FinalizeParams& params) {
    cuda_emu::launch(grid, kernels::kFinalizeThreads, kernels::finalize_kernel, params);
  }
};

}  // namespace amp_inspect
