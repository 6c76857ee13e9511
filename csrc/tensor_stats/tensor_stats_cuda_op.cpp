// tensor_stats_cuda_op.cpp: the CUDA op of amp_inspect::tensor_stats (host side, built by the host compiler into
// amp_inspect/_C_cuda, the library amp_inspect loads only beside a torch of the CUDA major it was built for).
// It checks the inputs, allocates the outputs and a workspace on the inputs' device and launches the kernels
// of tensor_stats_cuda.cu on the current stream. Nothing here waits for the GPU. Stable ABI only: the current
// stream comes from the C shim's aoti_torch_get_current_cuda_stream (torch::stable::accelerator's stream
// handle gives no cudaStream_t before torch 2.13), the capture state from cudaStreamIsCapturing, the device
// guard is torch::stable::accelerator::DeviceGuard.
//
// The tensor table: up to kInlineViews tensors travel in the kernel's parameters. A larger call copies its
// table to device memory asynchronously from pinned memory, except while the stream is being captured into
// a CUDA graph: a replay would read that pinned buffer again after it was reused, so a captured call takes
// one launch per kInlineViews tensors instead, each with its views in its parameters (replayed by value).
#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <cstring>
#include <vector>

#include "tensor_stats/tensor_stats_call.h"
#include "tensor_stats/tensor_stats_cuda.h"

namespace amp_inspect {
namespace {

Device call_device(const std::vector<Tensor>& tensors) {
  AMPI_CHECK(!tensors.empty(), "amp_inspect.tensor_stats: the CUDA kernel needs at least one tensor");
  const Device device = tensors[0].device();
  AMPI_CHECK(device.type() == DeviceType::CUDA, "amp_inspect.tensor_stats: tensor 0 is on ", device_name(device),
             ", not CUDA");
  return device;
}

cudaStream_t current_stream(int device_index) {
  void* stream = nullptr;
  AMPI_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream) == AOTI_TORCH_SUCCESS,
             "amp_inspect.tensor_stats: could not get the current CUDA stream of cuda:", device_index);
  return static_cast<cudaStream_t>(stream);
}

bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error = cudaStreamIsCapturing(stream, &status);
  AMPI_CHECK(error == cudaSuccess, "amp_inspect.tensor_stats: cudaStreamIsCapturing failed: ",
             cudaGetErrorString(error));
  return status != cudaStreamCaptureStatusNone;
}

// Allocates outputs and workspace, places the tensor table and launches; the caller holds the device guard.
StatsOutputs run_cuda(const StatsCall& call, const Device& device) {
  KernelCall k = prepare_kernel_call(call, device);
  // The kernels are compiled per input dtype: the views of each dtype go to one launch.
  std::vector<TensorView> views(call.views.size());
  group_views_by_dtype(call.views.data(), static_cast<int64_t>(views.size()), call.chunk_elems, views.data());
  k.plan.host_views = views.data();
  const cudaStream_t stream = current_stream(device.index());
  Tensor device_table = Tensor();
  if (static_cast<int64_t>(views.size()) > kInlineViews && !capturing(stream)) {
    // The caching host allocator keeps the pinned block alive until the copy queued on this stream has run.
    const int64_t table_bytes = static_cast<int64_t>(views.size() * sizeof(TensorView));
    Tensor host_table = empty_tensor({table_bytes}, ScalarType::Byte, Device(DeviceType::CPU), /*pinned=*/true);
    std::memcpy(host_table.data_ptr(), views.data(), static_cast<size_t>(table_bytes));
    device_table = empty_tensor({table_bytes}, ScalarType::Byte, device);
    torch::stable::copy_(device_table, host_table, /*non_blocking=*/true);
    k.plan.device_views = static_cast<const TensorView*>(device_table.data_ptr());
  }
  launch_tensor_stats(k.plan, device.index(), stream);
  // The table, the workspace and any contiguous copies are freed on return: safe, since the caching
  // allocator hands their memory out again only to work queued after these kernels on this stream.
  return k.out;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> tensor_stats_cuda(std::vector<Tensor> tensors,
                                                                     std::optional<Tensor> scale,
                                                                     std::optional<double> scale_value,
                                                                     std::vector<std::string> formats) {
  const Device device = call_device(tensors);
  const torch::stable::accelerator::DeviceGuard guard(device.index());
  const StatsOutputs out = run_cuda(prepare_call(tensors, scale, scale_value, formats, kCudaChunkElems), device);
  return out.returned();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> unscale_stats_cuda(std::vector<Tensor> tensors, Tensor inv_scale,
                                                                      Tensor found_inf,
                                                                      std::vector<std::string> formats) {
  const Device device = call_device(tensors);
  const torch::stable::accelerator::DeviceGuard guard(device.index());
  StatsCall call = prepare_call(tensors, std::nullopt, std::nullopt, formats, kCudaChunkElems);
  prepare_unscale(call, tensors, inv_scale, found_inf);
  const StatsOutputs out = run_cuda(call, device);
  return out.returned();
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
