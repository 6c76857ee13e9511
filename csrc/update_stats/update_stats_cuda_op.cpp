// update_stats_cuda_op.cpp: the CUDA op of amp_inspect::update_stats (host side, built by the host compiler into
// amp_inspect/_C_cuda; the schema is defined with the CPU kernel in _C). It checks the inputs, allocates the
// outputs on the tensors' device and launches the kernel of update_stats_cuda.cu on the current stream. Nothing
// here waits for the GPU. Every launch carries its views in its parameters (no table copy), so the op is also safe
// under CUDA graph capture. Stable ABI only, as tensor_stats_cuda_op.cpp.
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>

#include <tuple>
#include <vector>

#include "common/op.h"
#include "update_stats/update_stats_cuda.h"
#include "update_stats/update_stats_kernel_call.h"

namespace amp_inspect {
namespace {

constexpr const char* kUpdateOp = "amp_inspect.update_stats";

std::tuple<Tensor, Tensor, Tensor> update_stats_cuda(std::vector<Tensor> before, std::vector<Tensor> after,
                                                     std::vector<Tensor> grads, std::vector<Tensor> exp_avg_sq) {
  AMPI_CHECK(!before.empty(), kUpdateOp, ": the CUDA kernel needs at least one tensor");
  const Device device = before[0].device();
  AMPI_CHECK(device.type() == DeviceType::CUDA, kUpdateOp, ": before[0] is on ", device_name(device), ", not CUDA");
  const torch::stable::accelerator::DeviceGuard guard(device.index());
  UpdateKernelCall k;
  k.call = prepare_update_call(before, after, grads, exp_avg_sq);
  plan_update_kernels(k, device, kUpdateChunkElems);
  void* stream = nullptr;
  AMPI_CHECK(aoti_torch_get_current_cuda_stream(device.index(), &stream) == AOTI_TORCH_SUCCESS, kUpdateOp,
             ": could not get the current CUDA stream of cuda:", device.index());
  launch_update_stats(k.plan, device.index(), static_cast<cudaStream_t>(stream));
  // Contiguous copies are freed on return: safe, since the caching allocator hands their memory out again only
  // to work queued after these kernels on this stream.
  return k.out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("update_stats", TORCH_BOX(&amp_inspect::update_stats_cuda));
}
