// tensor_stats_emu.cpp: the CUDA kernels of tensor_stats_kernels.cuh, compiled by the host compiler with
// cuda_emu.h in front and run on the CPU, each CUDA thread a host thread. Tests only
// (torch.ops.amp_inspect._tensor_stats_emulated / _unscale_stats_emulated_, see tests/test_cuda_emu.py): it
// proves the kernels' chunking, reductions, barriers and atomics on every CI run, without a GPU.
// The host side is the CUDA op's own (prepare_call, prepare_kernel_call, kernels::run_stats); only the
// backend differs: host memory, a chosen number of blocks, and emulated launches.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>

#include "tensor_stats.h"
// The shim and the kernels come last: the shim's macros must not meet the ATen headers.
#include "tensor_stats_emu_backend.h"

namespace amp_inspect {
namespace {

StatsOutputs run_emulated(const StatsCall& call, int64_t blocks, bool inline_views) {
  TORCH_CHECK(call.chunk_elems > 0 && call.chunk_elems % 8 == 0,
              "amp_inspect._tensor_stats_emulated: chunk_elems must be a positive multiple of 8, got ",
              call.chunk_elems);
  KernelCall k = prepare_kernel_call(call, at::Device(at::kCPU));
  if (!inline_views) k.plan.device_views = call.views.data();  // host memory is the "device" here
  EmulatedBackend backend;
  backend.blocks = blocks;
  try {
    kernels::run_stats(k.plan, backend);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "amp_inspect: ", e.what());
  }
  return k.out;
}

void check_cpu(const std::vector<at::Tensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].device().is_cpu(), "amp_inspect._tensor_stats_emulated: tensor ", i, " is on ",
                tensors[i].device(), "; the emulation runs on CPU tensors");
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tensor_stats_emulated(
    const std::vector<at::Tensor>& tensors, const std::optional<at::Tensor>& scale,
    std::optional<double> scale_value, const std::vector<std::string>& formats, int64_t chunk_elems, int64_t blocks,
    bool inline_views) {
  check_cpu(tensors);
  const StatsOutputs out =
      run_emulated(prepare_call(tensors, scale, scale_value, formats, chunk_elems), blocks, inline_views);
  return {out.counts, out.hist, out.amax, out.amin_nonzero, out.sumsq};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> unscale_stats_emulated(
    const std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale, const at::Tensor& found_inf,
    const std::vector<std::string>& formats, int64_t chunk_elems, int64_t blocks, bool inline_views) {
  check_cpu(tensors);
  StatsCall call = prepare_call(tensors, std::nullopt, std::nullopt, formats, chunk_elems);
  prepare_unscale(call, tensors, inv_scale, found_inf);
  const StatsOutputs out = run_emulated(call, blocks, inline_views);
  return {out.counts, out.hist, out.amax, out.amin_nonzero, out.sumsq};
}

}  // namespace
}  // namespace amp_inspect

TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("_tensor_stats_emulated", &amp_inspect::tensor_stats_emulated);
  m.impl("_unscale_stats_emulated_", &amp_inspect::unscale_stats_emulated);
}
