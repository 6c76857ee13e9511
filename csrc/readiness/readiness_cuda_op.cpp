// readiness_cuda_op.cpp: the CUDA op of amp_inspect::format_readiness (host side, built by the host compiler into
// amp_inspect/_C_cuda; the schema is defined with the CPU kernel in _C). It checks the inputs, allocates the
// outputs on the tensors' device and launches the kernels of readiness_cuda.cu on the current stream. Nothing
// here waits for the GPU. Every launch carries its views in its parameters (no table copy), so the op is also
// safe under CUDA graph capture. Stable ABI only, as tensor_stats_cuda_op.cpp.
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "readiness/readiness_cuda.h"
#include "readiness/readiness_kernel_call.h"
#include "common/op.h"

namespace amp_inspect {
namespace {

constexpr const char* kReadinessOp = "amp_inspect.format_readiness";

std::tuple<Tensor, Tensor, Tensor> format_readiness_cuda(std::vector<Tensor> tensors, std::vector<int64_t> recipes,
                                                         std::optional<Tensor> tensor_amax) {
  AMPI_CHECK(!tensors.empty() || tensor_amax.has_value(), kReadinessOp, ": the CUDA kernel needs at least one tensor");
  const Device device = !tensors.empty() ? tensors[0].device() : tensor_amax->device();
  AMPI_CHECK(device.type() == DeviceType::CUDA, kReadinessOp, ": tensor 0 is on ", device_name(device), ", not CUDA");
  const torch::stable::accelerator::DeviceGuard guard(device.index());
  ReadinessKernelCall k;
  k.call = prepare_readiness_call(tensors, recipes, tensor_amax);
  plan_readiness_kernels(k, device, kReadinessChunkTasks);
  void* stream = nullptr;
  AMPI_CHECK(aoti_torch_get_current_cuda_stream(device.index(), &stream) == AOTI_TORCH_SUCCESS, kReadinessOp,
             ": could not get the current CUDA stream of cuda:", device.index());
  launch_format_readiness(k.plan, device.index(), static_cast<cudaStream_t>(stream));
  // Contiguous copies are freed on return: safe, since the caching allocator hands their memory out again only
  // to work queued after these kernels on this stream.
  return k.out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("format_readiness", TORCH_BOX(&amp_inspect::format_readiness_cuda));
}
