// update_stats_cuda_op.cpp: the CUDA op of amp_inspect::update_stats (host side, built by the host compiler into
// amp_inspect/_C_cuda; the schema is defined with the CPU kernel in _C): the CPU op's checks (update_stats_call.h),
// the outputs and plan on the tensors' device, and the kernel of update_stats_cuda.cu launched on the current stream
// (common/cuda_op.h). Nothing here waits for the GPU. Every launch carries its views in its parameters (no table
// copy), so the op is also safe under CUDA graph capture.
#include <torch/csrc/stable/library.h>

#include <tuple>
#include <vector>

#include "common/cuda_op.h"
#include "update_stats/update_stats_call.h"

namespace amp_inspect {
namespace {

std::tuple<Tensor, Tensor, Tensor> update_stats_cuda(std::vector<Tensor> before, std::vector<Tensor> after,
                                                     std::vector<Tensor> grads, std::vector<Tensor> exp_avg_sq) {
  const CudaOpScope cuda(kUpdateOp, !before.empty() ? &before[0] : nullptr, "before[0]");
  UpdateKernelCall k;
  k.call = prepare_update_call(before, after, grads, exp_avg_sq);
  plan_update_kernels(k, cuda.device(), kUpdateChunkElems);
  launch_update_stats(k.plan, cuda.device_index(), cuda.stream());
  // Contiguous copies are freed on return: safe, since the caching allocator hands their memory out again only
  // to work queued after these kernels on this stream.
  return k.out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("update_stats", TORCH_BOX(&amp_inspect::update_stats_cuda));
}
