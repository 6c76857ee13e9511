// tensor_stats_cuda_op.cpp: the CUDA op of amp_inspect::tensor_stats and unscale_stats_ (host side, built by the host
// compiler into amp_inspect/_C_cuda, the library amp_inspect loads only beside a torch of the CUDA major it was built
// for). It checks the inputs, allocates the outputs and a workspace on the inputs' device and launches the kernels
// of tensor_stats_cuda.cu on the current stream (common/cuda_op.h: device guard, stream, capture state). Nothing here
// waits for the GPU.
//
// The tensor table: up to kInlineViews tensors travel in the kernel's parameters. A larger call copies its
// table to device memory asynchronously from pinned memory, except while the stream is being captured into
// a CUDA graph: a replay would read that pinned buffer again after it was reused, so a captured call takes
// one launch per kInlineViews tensors instead, each with its views in its parameters (replayed by value).
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <cstring>
#include <vector>

#include "common/cuda_op.h"
#include "tensor_stats/tensor_stats.h"
#include "tensor_stats/tensor_stats_call.h"

namespace amp_inspect {
namespace {

const Tensor* first_tensor(const std::vector<Tensor>& tensors) { return tensors.empty() ? nullptr : &tensors[0]; }

// Allocates outputs and workspace, places the tensor table and launches; `cuda` holds the device guard.
StatsOutputs run_cuda(const StatsCall& call, const CudaOpScope& cuda) {
  StatsKernelCall k = prepare_kernel_call(call, cuda.device());
  // The kernels are compiled per input dtype: the views of each dtype go to one launch.
  std::vector<TensorView> views(call.views.size());
  group_views_by_dtype(call.views.data(), static_cast<int64_t>(views.size()), call.chunk_elems, views.data());
  k.plan.host_views = views.data();
  void* const stream = cuda.stream();
  Tensor device_table = Tensor();
  if (static_cast<int64_t>(views.size()) > kInlineViews && !cuda.capturing(stream)) {
    // The caching host allocator keeps the pinned block alive until the copy queued on this stream has run.
    const int64_t table_bytes = static_cast<int64_t>(views.size() * sizeof(TensorView));
    Tensor host_table = empty_tensor({table_bytes}, ScalarType::Byte, Device(DeviceType::CPU), /*pinned=*/true);
    std::memcpy(host_table.data_ptr(), views.data(), static_cast<size_t>(table_bytes));
    device_table = empty_tensor({table_bytes}, ScalarType::Byte, cuda.device());
    torch::stable::copy_(device_table, host_table, /*non_blocking=*/true);
    k.plan.device_views = static_cast<const TensorView*>(device_table.data_ptr());
  }
  launch_tensor_stats(k.plan, cuda.device_index(), stream);
  // The table, the workspace and any contiguous copies are freed on return: safe, since the caching
  // allocator hands their memory out again only to work queued after these kernels on this stream.
  return k.out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> tensor_stats_cuda(std::vector<Tensor> tensors,
                                                                     std::optional<Tensor> scale,
                                                                     std::optional<double> scale_value,
                                                                     std::vector<std::string> formats) {
  const CudaOpScope cuda(kStatsOp, first_tensor(tensors), "tensor 0");
  return run_cuda(prepare_call(tensors, scale, scale_value, formats, kCudaChunkElems), cuda).returned();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> unscale_stats_cuda(std::vector<Tensor> tensors, Tensor inv_scale,
                                                                      Tensor found_inf,
                                                                      std::vector<std::string> formats) {
  const CudaOpScope cuda(kStatsOp, first_tensor(tensors), "tensor 0");
  StatsCall call = prepare_call(tensors, std::nullopt, std::nullopt, formats, kCudaChunkElems);
  prepare_unscale(call, tensors, inv_scale, found_inf);
  return run_cuda(call, cuda).returned();
}

bool cuda_device_supported(int64_t device_index) { return device_supported(static_cast<int>(device_index)); }

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_FRAGMENT(amp_inspect, m) {
  // Whether the binary holds a kernel image this GPU can run (amp_inspect falls back to the reference if not).
  m.def("_cuda_device_supported(int device) -> bool");
}

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CompositeExplicitAutograd, m) {
  m.impl("_cuda_device_supported", TORCH_BOX(&amp_inspect::cuda_device_supported));
}

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("tensor_stats", TORCH_BOX(&amp_inspect::tensor_stats_cuda));
  m.impl("unscale_stats_", TORCH_BOX(&amp_inspect::unscale_stats_cuda));
}
