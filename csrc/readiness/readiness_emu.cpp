// readiness_emu.cpp: the CUDA kernels of format readiness (readiness_kernels.cuh), compiled by the host compiler
// with cuda_emu.h in front and run on the CPU, each CUDA thread a host thread. Tests only
// (torch.ops.amp_inspect._format_readiness_emulated, tests/test_readiness_emu.py): it proves the kernels' tiling,
// butterflies, block reductions and atomics on every CI run, without a GPU. The host side is the CUDA op's own
// (prepare_readiness_call, plan_readiness_kernels, readiness_kernels::run_readiness); only the backend differs
// (common/emulated_op.h): host memory, a chosen work chunk and number of blocks, emulated launches. Built into the
// test-only library amp_inspect._C_emu.
#include <torch/csrc/stable/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "readiness/readiness_call.h"
// The emulation and the kernels come last: the emulation shim's macros must not meet the torch headers.
#include "common/emulated_op.h"
#include "readiness/readiness_kernels.cuh"

namespace amp_inspect {
namespace {

constexpr const char* kEmulatedOp = "amp_inspect._format_readiness_emulated: ";

std::tuple<Tensor, Tensor, Tensor> format_readiness_emulated(std::vector<Tensor> tensors, std::vector<int64_t> recipes,
                                                             std::optional<Tensor> tensor_amax, int64_t chunk_tasks,
                                                             int64_t blocks) {
  check_emulated_on_cpu(kEmulatedOp, tensors, "tensor ");
  AMPI_CHECK(chunk_tasks > 0, kEmulatedOp, "chunk_tasks must be positive, got ", chunk_tasks);
  ReadinessKernelCall k;
  k.call = prepare_readiness_call(tensors, recipes, tensor_amax);
  plan_readiness_kernels(k, Device(DeviceType::CPU), chunk_tasks);
  run_emulated(blocks, [&](cuda_emu::Backend& backend) { readiness_kernels::run_readiness(k.plan, backend); });
  return k.out.returned();
}

// How many (q, s) cases readiness.h's grid_quotient gets other than the float64 division q / s, over all of them
// for an element grid of `mbits` mantissa bits (grid_quotient's comment says why these are all): q every integer
// of 1 + mbits bits, s every float32 in [1, 2) (2^23 mantissas), with r = fl64(1 / s). Negative q mirror these.
int64_t readiness_quotient_mismatches(int64_t mbits) {
  AMPI_CHECK(mbits >= 1 && mbits <= 3, kEmulatedOp, "mbits must be 1, 2 or 3 (E2M1, E5M2, E4M3), got ", mbits);
  int64_t mismatches = 0;
  for (uint32_t mantissa = 0; mantissa <= kMantissaMask32; ++mantissa) {
    const double s = float32_bits_to_double(kFloatOneBits | mantissa);
    const double r = 1.0 / s;
    for (int64_t m = int64_t{1} << mbits; m < int64_t{2} << mbits; ++m) {
      const double q = static_cast<double>(m);
      mismatches += grid_quotient(q, s, r) != q / s;
    }
  }
  return mismatches;
}

}  // namespace
}  // namespace amp_inspect

// Tests only: the CUDA kernels' source run on the CPU, with the work chunk (warp tasks per chunk; the GPU uses
// kReadinessChunkTasks) and the number of blocks chosen by the caller (blocks <= 0: as many as chunks, at most
// 4). And the exhaustive check of readiness.h's grid_quotient. A fragment: _C defines the library.
STABLE_TORCH_LIBRARY_FRAGMENT(amp_inspect, m) {
  m.def(
      "_format_readiness_emulated(Tensor[] tensors, int[] recipes, Tensor? tensor_amax, int chunk_tasks, "
      "int blocks) -> (Tensor counts, Tensor sums, Tensor amax)");
  m.def("_readiness_quotient_mismatches(int mbits) -> int");
}

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("_format_readiness_emulated", TORCH_BOX(&amp_inspect::format_readiness_emulated));
}

// An op without tensor arguments is served by the CompositeExplicitAutograd kernel.
STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CompositeExplicitAutograd, m) {
  m.impl("_readiness_quotient_mismatches", TORCH_BOX(&amp_inspect::readiness_quotient_mismatches));
}
