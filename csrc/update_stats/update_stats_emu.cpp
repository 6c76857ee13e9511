// update_stats_emu.cpp: the CUDA kernel of update_stats (update_stats_kernels.cuh), compiled by the host compiler
// with cuda_emu.h in front and run on the CPU, each CUDA thread a host thread. Tests only
// (torch.ops.amp_inspect._update_stats_emulated, tests/test_update_stats_emu.py): it proves the kernel's chunking,
// block reduction and atomics on every CI run, without a GPU. The host side is the CUDA op's own
// (prepare_update_call, plan_update_kernels, update_kernels::run_update_stats); only the backend differs
// (common/emulated_op.h): host memory, a chosen chunk size and number of blocks, emulated launches. Built into the
// test-only _C_emu.
#include <torch/csrc/stable/library.h>

#include <tuple>
#include <vector>

#include "update_stats/update_stats_call.h"
// The emulation and the kernel come last: the emulation shim's macros must not meet the torch headers.
#include "common/emulated_op.h"
#include "update_stats/update_stats_kernels.cuh"

namespace amp_inspect {
namespace {

constexpr const char* kEmulatedOp = "amp_inspect._update_stats_emulated: ";

std::tuple<Tensor, Tensor, Tensor> update_stats_emulated(std::vector<Tensor> before, std::vector<Tensor> after,
                                                         std::vector<Tensor> grads, std::vector<Tensor> exp_avg_sq,
                                                         int64_t chunk_elems, int64_t blocks) {
  check_emulated_on_cpu(kEmulatedOp, before, "before[", "]");
  // The kernel counts a chunk's elements in uint32 (update_stats_kernels.cuh).
  AMPI_CHECK(chunk_elems > 0 && chunk_elems <= (int64_t{1} << 31), kEmulatedOp,
             "chunk_elems must be in [1, 2^31], got ", chunk_elems);
  UpdateKernelCall k;
  k.call = prepare_update_call(before, after, grads, exp_avg_sq);
  plan_update_kernels(k, Device(DeviceType::CPU), chunk_elems);
  run_emulated(blocks, [&](cuda_emu::Backend& backend) { update_kernels::run_update_stats(k.plan, backend); });
  return k.out.returned();
}

}  // namespace
}  // namespace amp_inspect

// Tests only: the CUDA kernel's source run on the CPU, with the chunk size (the GPU uses kUpdateChunkElems) and the
// number of blocks chosen by the caller (blocks <= 0: as many as chunks, at most 4). A fragment: _C defines the
// library.
STABLE_TORCH_LIBRARY_FRAGMENT(amp_inspect, m) {
  m.def(
      "_update_stats_emulated(Tensor[] before, Tensor[] after, Tensor[] grads, Tensor[] exp_avg_sq, int chunk_elems, "
      "int blocks) -> (Tensor counts, Tensor sums, Tensor amax)");
}

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("_update_stats_emulated", TORCH_BOX(&amp_inspect::update_stats_emulated));
}
