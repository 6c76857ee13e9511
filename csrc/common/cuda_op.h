// cuda_op.h: the glue every op's CUDA op shares (host side, built by the host compiler into amp_inspect/_C_cuda, the
// library amp_inspect loads only beside a torch of the CUDA major it was built for): the device a call runs on,
// checked to be a CUDA device, its device guard, the current stream and whether that stream is being captured into
// a CUDA graph. Each op's launch sequence then zeroes its outputs on that stream (common/cuda_launch.cuh's
// CudaBackend); nothing here waits for the GPU.
//
// Stable ABI only: the current stream comes from the C shim's aoti_torch_get_current_cuda_stream
// (torch::stable::accelerator's stream handle gives no cudaStream_t before torch 2.13), the capture state from
// cudaStreamIsCapturing (refusing the legacy default stream while another stream captures), the device guard is
// torch::stable::accelerator::DeviceGuard.
#pragma once

#include <cuda_runtime_api.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "common/op.h"

namespace amp_inspect {

// One call of a CUDA op, from its checks to its launch: the call's device (the device guard holds it current
// while the scope lives) and its stream. `op` begins each error sentence ("amp_inspect.format_readiness: ").
class CudaOpScope {
 public:
  // `first`: the call's first tensor (null when it has none: an error); `first_name`: how the op's sentences name
  // it ("tensor 0", "before[0]").
  CudaOpScope(const char* op, const Tensor* first, const char* first_name)
      : op_(op), device_(checked_device(op, first, first_name)), guard_(device_.index()) {}

  const Device& device() const { return device_; }
  int device_index() const { return device_.index(); }

  // The device's current stream, as the C shim hands it (a cudaStream_t): what every launch of the call is queued on.
  void* stream() const {
    void* stream = nullptr;
    AMPI_CHECK(aoti_torch_get_current_cuda_stream(device_.index(), &stream) == AOTI_TORCH_SUCCESS, op_,
               "could not get the current CUDA stream of cuda:", device_.index());
    return stream;
  }

  // Whether `stream` is being captured into a CUDA graph: a replay repeats the launches with their parameters as
  // captured, so a call then passes nothing to its kernels through memory it reuses (tensor_stats' device table).
  // The legacy default stream synchronises with every blocking stream of its device, so while one of those is being
  // captured (by another thread, say, in global mode) CUDA answers the query on it with
  // cudaErrorStreamCaptureImplicit and leaves that capture intact; the legacy stream is unusable until the capture
  // ends. The call is refused in one sentence, naming the cause, rather than raising the query's bare error.
  bool capturing(void* stream) const {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t error = cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &status);
    if (error == cudaErrorStreamCaptureImplicit) {
      static_cast<void>(cudaGetLastError());  // not sticky; cleared so torch's next check does not report it as its own
      fail(op_, "the current stream is CUDA's legacy default stream while another stream of cuda:", device_.index(),
           " is being captured into a CUDA graph; run the call on a side stream (torch.cuda.stream) or outside the "
           "capture");
    }
    AMPI_CHECK(error == cudaSuccess, op_, "cudaStreamIsCapturing failed: ", cudaGetErrorString(error));
    return status != cudaStreamCaptureStatusNone;
  }

 private:
  static Device checked_device(const char* op, const Tensor* first, const char* first_name) {
    AMPI_CHECK(first != nullptr, op, "the CUDA kernel needs at least one tensor");
    const Device device = first->device();
    AMPI_CHECK(device.type() == DeviceType::CUDA, op, first_name, " is on ", device_name(device), ", not CUDA");
    return device;
  }

  const char* op_;
  Device device_;
  torch::stable::accelerator::DeviceGuard guard_;
};

}  // namespace amp_inspect
