// readiness_cuda_op.cpp: the CUDA op of amp_inspect::format_readiness (host side, built by the host compiler into
// amp_inspect/_C_cuda; the schema is defined with the CPU kernel in _C): the CPU op's checks (readiness_call.h), the
// outputs and plan on the tensors' device, and the kernels of readiness_cuda.cu launched on the current stream
// (common/cuda_op.h). Nothing here waits for the GPU. Every launch carries its views in its parameters (no table
// copy), so the op is also safe under CUDA graph capture.
#include <torch/csrc/stable/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "common/cuda_op.h"
#include "readiness/readiness_call.h"

namespace amp_inspect {
namespace {

std::tuple<Tensor, Tensor, Tensor> format_readiness_cuda(std::vector<Tensor> tensors, std::vector<int64_t> recipes,
                                                         std::optional<Tensor> tensor_amax) {
  // A call without tensors but with a tensor_amax runs on its device.
  const Tensor* first = !tensors.empty() ? &tensors[0] : (tensor_amax.has_value() ? &*tensor_amax : nullptr);
  const CudaOpScope cuda(kReadinessOp, first, "tensor 0");
  ReadinessKernelCall k;
  k.call = prepare_readiness_call(tensors, recipes, tensor_amax);
  plan_readiness_kernels(k, cuda.device(), kReadinessChunkTasks);
  launch_format_readiness(k.plan, cuda.device_index(), cuda.stream());
  // Contiguous copies are freed on return: safe, since the caching allocator hands their memory out again only
  // to work queued after these kernels on this stream.
  return k.out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("format_readiness", TORCH_BOX(&amp_inspect::format_readiness_cuda));
}
