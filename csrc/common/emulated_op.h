// emulated_op.h: what every emulated op shares (tests only, the test-only library amp_inspect._C_emu): an op's CUDA
// kernels compiled by the host compiler with cuda_emu.h in front and run on the CPU, each CUDA thread a host thread,
// on the CUDA op's own host side (its checked call and its plan); only the backend differs: host memory, a chosen
// number of blocks, emulated launches (cuda_emu::Backend).
//
// Include it after every torch header the file needs and before the op's kernels (<op>_kernels.cuh): the
// emulation shim's macros must not meet the torch headers.
#pragma once

#include <cstdint>
#include <exception>
#include <vector>

#include "common/op.h"
// The emulation shim last: its macros must not meet the torch headers.
#include "common/cuda_emu.h"

namespace amp_inspect {

// Every tensor of an emulated op on the CPU: "<op><name><i><suffix> is on meta; the emulation runs on CPU tensors",
// e.g. op "amp_inspect._update_stats_emulated: ", name "before[", suffix "]".
inline void check_emulated_on_cpu(const char* op, const std::vector<Tensor>& tensors, const char* name,
                                  const char* suffix = "") {
  for (size_t i = 0; i < tensors.size(); ++i) {
    AMPI_CHECK(tensors[i].is_cpu(), op, name, i, suffix, " is on ", device_name(tensors[i].device()),
               "; the emulation runs on CPU tensors");
  }
}

// Runs an op's launch sequence, launch(backend), on the emulated backend: `blocks` > 0 blocks per launch exactly
// (more than the work on purpose: such blocks find none), else as many as the work, at most
// cuda_emu::Backend::kDefaultBlocks. A broken launch (a barrier some threads never reach, a kernel's exception) is
// raised as the op's error, one sentence: "amp_inspect: emulated CUDA launch, block 0: ...".
template <class Launch>
void run_emulated(int64_t blocks, Launch&& launch) {
  cuda_emu::Backend backend;
  backend.blocks_override = blocks;
  try {
    launch(backend);
  } catch (const std::exception& e) {
    fail("amp_inspect: ", e.what());
  }
}

}  // namespace amp_inspect
