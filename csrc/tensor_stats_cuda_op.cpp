// tensor_stats_cuda_op.cpp: the CUDA op of amp_inspect::tensor_stats (host side, built by the host compiler).
// It checks the inputs, allocates the outputs and a workspace on the inputs' device and launches the kernels
// of tensor_stats_cuda.cu on the current stream. Nothing here waits for the GPU.
//
// The tensor table: up to kInlineViews tensors travel in the kernel's parameters. A larger call copies its
// table to device memory asynchronously from pinned memory, except while the stream is being captured into
// a CUDA graph: a replay would read that pinned buffer again after it was reused, so a captured call takes
// one launch per kInlineViews tensors instead, each with its views in its parameters (replayed by value).
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstring>

#include "tensor_stats.h"
#include "tensor_stats_cuda.h"

namespace amp_inspect {
namespace {

at::Device call_device(const std::vector<at::Tensor>& tensors) {
  TORCH_CHECK(!tensors.empty(), "amp_inspect.tensor_stats: the CUDA kernel needs at least one tensor");
  const at::Device device = tensors[0].device();
  TORCH_CHECK(device.is_cuda(), "amp_inspect.tensor_stats: tensor 0 is on ", device, ", not CUDA");
  return device;
}

// Allocates outputs and workspace, places the tensor table and launches; the caller holds the device guard.
StatsOutputs run_cuda(const StatsCall& call, const at::Device& device) {
  KernelCall k = prepare_kernel_call(call, device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();
  at::Tensor device_table;
  const bool capturing = c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
  if (static_cast<int64_t>(call.views.size()) > kInlineViews && !capturing) {
    // The caching host allocator keeps the pinned block alive until the copy queued on this stream has run.
    const int64_t table_bytes = static_cast<int64_t>(call.views.size() * sizeof(TensorView));
    at::Tensor host_table = at::empty({table_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(host_table.data_ptr(), call.views.data(), static_cast<size_t>(table_bytes));
    device_table = at::empty({table_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    device_table.copy_(host_table, /*non_blocking=*/true);
    k.plan.device_views = static_cast<const TensorView*>(device_table.data_ptr());
  }
  launch_tensor_stats(k.plan, device.index(), stream);
  // The table, the workspace and any contiguous copies are freed on return: safe, since the caching
  // allocator hands their memory out again only to work queued after these kernels on this stream.
  return k.out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tensor_stats_cuda(
    const std::vector<at::Tensor>& tensors, const std::optional<at::Tensor>& scale,
    std::optional<double> scale_value, const std::vector<std::string>& formats) {
  const at::Device device = call_device(tensors);
  const c10::cuda::CUDAGuard guard(device);
  const StatsOutputs out = run_cuda(prepare_call(tensors, scale, scale_value, formats, kCudaChunkElems), device);
  return {out.counts, out.hist, out.amax, out.amin_nonzero, out.sumsq};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> unscale_stats_cuda(
    const std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale, const at::Tensor& found_inf,
    const std::vector<std::string>& formats) {
  const at::Device device = call_device(tensors);
  const c10::cuda::CUDAGuard guard(device);
  StatsCall call = prepare_call(tensors, std::nullopt, std::nullopt, formats, kCudaChunkElems);
  prepare_unscale(call, tensors, inv_scale, found_inf);
  const StatsOutputs out = run_cuda(call, device);
  return {out.counts, out.hist, out.amax, out.amin_nonzero, out.sumsq};
}

bool cuda_device_supported(int64_t device_index) { return device_supported(static_cast<int>(device_index)); }

}  // namespace
}  // namespace amp_inspect

TORCH_LIBRARY_FRAGMENT(amp_inspect, m) {
  // Whether the binary holds a kernel image this GPU can run (amp_inspect falls back to the reference if not).
  m.def("_cuda_device_supported(int device) -> bool", &amp_inspect::cuda_device_supported);
}

TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("tensor_stats", &amp_inspect::tensor_stats_cuda);
  m.impl("unscale_stats_", &amp_inspect::unscale_stats_cuda);
}
