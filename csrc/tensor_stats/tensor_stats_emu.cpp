// tensor_stats_emu.cpp: the CUDA kernels of tensor_stats_kernels.cuh, compiled by the host compiler with
// cuda_emu.h in front and run on the CPU, each CUDA thread a host thread. Tests only
// (torch.ops.amp_inspect._tensor_stats_emulated / _unscale_stats_emulated_, see tests/test_cuda_emu.py): it
// proves the kernels' chunking, reductions, barriers and atomics on every CI run, without a GPU.
// The host side is the CUDA op's own (prepare_call, prepare_kernel_call, kernels::run_stats); only the
// backend differs (common/emulated_op.h): host memory, a chosen number of blocks, and emulated launches.
// Built as the test-only library amp_inspect._C_emu (never in a wheel, setup.py), loaded after amp_inspect._C; this
// file also holds that library's Python module.
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include <vector>

#include "tensor_stats/tensor_stats_call.h"
// The emulation and the kernels come last: the emulation shim's macros must not meet the torch headers.
#include "common/emulated_op.h"
#include "tensor_stats/tensor_stats_kernels.cuh"

namespace amp_inspect {
namespace {

constexpr const char* kEmulatedOp = "amp_inspect._tensor_stats_emulated: ";
// The kernels read a chunk in whole 16-byte vectors of every dtype.
constexpr int64_t kChunkElemsMultiple = 8;

StatsOutputs run_emulated_stats(const StatsCall& call, int64_t blocks, bool inline_views) {
  AMPI_CHECK(call.chunk_elems > 0 && call.chunk_elems % kChunkElemsMultiple == 0, kEmulatedOp,
             "chunk_elems must be a positive multiple of ", kChunkElemsMultiple, ", got ", call.chunk_elems);
  StatsKernelCall k = prepare_kernel_call(call, Device(DeviceType::CPU));
  std::vector<TensorView> views(call.views.size());  // as the CUDA op does: one run of views per dtype
  group_views_by_dtype(call.views.data(), static_cast<int64_t>(views.size()), call.chunk_elems, views.data());
  k.plan.host_views = views.data();
  if (!inline_views) k.plan.device_views = views.data();  // host memory is the "device" here
  run_emulated(blocks, [&](cuda_emu::Backend& backend) { kernels::run_stats(k.plan, backend); });
  return k.out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> tensor_stats_emulated(std::vector<Tensor> tensors,
                                                                         std::optional<Tensor> scale,
                                                                         std::optional<double> scale_value,
                                                                         std::vector<std::string> formats,
                                                                         int64_t chunk_elems, int64_t blocks,
                                                                         bool inline_views) {
  check_emulated_on_cpu(kEmulatedOp, tensors, "tensor ");
  return run_emulated_stats(prepare_call(tensors, scale, scale_value, formats, chunk_elems), blocks, inline_views)
      .returned();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> unscale_stats_emulated(std::vector<Tensor> tensors, Tensor inv_scale,
                                                                          Tensor found_inf,
                                                                          std::vector<std::string> formats,
                                                                          int64_t chunk_elems, int64_t blocks,
                                                                          bool inline_views) {
  check_emulated_on_cpu(kEmulatedOp, tensors, "tensor ");
  StatsCall call = prepare_call(tensors, std::nullopt, std::nullopt, formats, chunk_elems);
  prepare_unscale(call, tensors, inv_scale, found_inf);
  return run_emulated_stats(call, blocks, inline_views).returned();
}

}  // namespace
}  // namespace amp_inspect

// Tests only: the CUDA kernels' source run on the CPU, with the chunk size and the number of blocks chosen by
// the caller (blocks <= 0: as many as chunks, at most 4), and with the views passed in the kernels' parameters
// (inline_views, as under CUDA graph capture) or as a table. A fragment: _C defines the library.
STABLE_TORCH_LIBRARY_FRAGMENT(amp_inspect, m) {
  m.def(
      "_tensor_stats_emulated(Tensor[] tensors, Tensor? scale, float? scale_value, str[] formats, int chunk_elems, "
      "int blocks, bool inline_views) -> (Tensor counts, Tensor hist, Tensor amax, Tensor amin_nonzero, "
      "Tensor sumsq)");
  m.def(
      "_unscale_stats_emulated_(Tensor(a!)[] tensors, Tensor inv_scale, Tensor(b!) found_inf, str[] formats, "
      "int chunk_elems, int blocks, bool inline_views) -> (Tensor counts, Tensor hist, Tensor amax, "
      "Tensor amin_nonzero, Tensor sumsq)");
}

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("_tensor_stats_emulated", TORCH_BOX(&amp_inspect::tensor_stats_emulated));
  m.impl("_unscale_stats_emulated_", TORCH_BOX(&amp_inspect::unscale_stats_emulated));
}

// `import amp_inspect._C_emu` (after amp_inspect._C) runs the registrations above; the module itself is empty.
PyMODINIT_FUNC PyInit__C_emu(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C_emu", nullptr, -1, nullptr, nullptr, nullptr, nullptr,
                               nullptr};
  return PyModule_Create(&module);
}
