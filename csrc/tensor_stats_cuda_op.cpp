// tensor_stats_cuda_op.cpp: the CUDA op of amp_inspect::tensor_stats (host side, built by the host compiler).
// It checks the inputs, allocates the outputs on the inputs' device, copies the tensor table to device
// memory asynchronously (from pinned memory, on the current stream) and launches the kernels of
// tensor_stats_cuda.cu. Nothing here waits for the GPU.
#include <ATen/ATen.h>
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

// Allocates the outputs, copies the tensor table to the device and launches; the caller holds the guard.
StatsOutputs run_cuda(const StatsCall& call, const at::Device& device) {
  const StatsOutputs out = allocate_outputs(call.num_tensors, call.num_formats, device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device.index()).stream();

  CudaStatsArgs args{};
  at::Tensor device_table;
  if (!call.views.empty()) {
    // The table goes through pinned memory so the copy is asynchronous; the caching host allocator keeps
    // the pinned block alive until the copy on this stream has run.
    const int64_t table_bytes = static_cast<int64_t>(call.views.size() * sizeof(TensorView));
    at::Tensor host_table = at::empty({table_bytes}, at::TensorOptions().dtype(at::kByte).pinned_memory(true));
    std::memcpy(host_table.data_ptr(), call.views.data(), static_cast<size_t>(table_bytes));
    device_table = at::empty({table_bytes}, at::TensorOptions().dtype(at::kByte).device(device));
    device_table.copy_(host_table, /*non_blocking=*/true);
    args.views = static_cast<const TensorView*>(device_table.data_ptr());
  }
  args.num_views = static_cast<int64_t>(call.views.size());
  args.num_tensors = call.num_tensors;
  args.total_chunks = call.total_chunks;
  for (int f = 0; f < call.num_formats; ++f) args.bounds[f] = call.bounds[f];
  args.num_formats = call.num_formats;
  args.has_scale = call.has_scale ? 1 : 0;
  args.scale_value = call.scale_value;
  args.scale_ptr = call.scale_ptr;
  args.inv_scale = call.unscale ? call.inv_scale_ptr : nullptr;
  args.found_inf = call.unscale ? call.found_inf_ptr : nullptr;
  args.counts = out.counts.data_ptr<int64_t>();
  args.hist = out.hist.data_ptr<int64_t>();
  args.amax = out.amax.data_ptr<float>();
  args.amin_nonzero = out.amin_nonzero.data_ptr<float>();
  args.sumsq = out.sumsq.data_ptr<double>();
  launch_tensor_stats(args, device.index(), stream);
  // The table and any contiguous copies are freed on return: safe, since the caching allocator hands
  // their memory out again only to work queued after these kernels on this stream.
  return out;
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

}  // namespace
}  // namespace amp_inspect

TORCH_LIBRARY_IMPL(amp_inspect, CUDA, m) {
  m.impl("tensor_stats", &amp_inspect::tensor_stats_cuda);
  m.impl("unscale_stats_", &amp_inspect::unscale_stats_cuda);
}
