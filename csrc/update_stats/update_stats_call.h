// update_stats_call.h: the host side of amp_inspect::update_stats shared by its backends: the checked, torch-free
// description of a call (per parameter tensor: contiguous views of before, after, grad and exp_avg_sq), the outputs,
// and the plan the CUDA kernel runs on. The element logic the backends run on it is update_stats.h.
//
// The op (schema in module.cpp):
//   update_stats(Tensor[] before, Tensor[] after, Tensor[] grads, Tensor[] exp_avg_sq) -> (counts, sums, amax)
//   counts int64   [T, 8]  numel, with_grad, lost, changed, weight_nonfinite, weight_subnormal, state_underflow,
//                          made_nonfinite
//   sums   float64 [T, 2]  sq_change, sq_weight
//   amax   float32 [T]     max |after| over finite after (0 when none)
// amp_inspect/core/statistics.py's UPDATE entries are the same table, checked against _C.layout()["update"].
#pragma once

#include <vector>

#include "common/op.h"
#include "update_stats/update_stats.h"
#include "update_stats/update_stats_launch.h"

namespace amp_inspect {

// How the op's error sentences begin.
constexpr const char* kUpdateOp = "amp_inspect.update_stats: ";

// One nonempty parameter tensor as the kernels read it: four contiguous arrays of `numel` elements.
struct UpdateView {
  const void* before;
  const void* after;
  const void* grad;
  const void* state;  // null: no exp_avg_sq given
  int64_t numel;
  int64_t out_row;  // the tensor's position in the caller's lists
  int32_t weight_dtype;  // InputDtype of before and after
  int32_t grad_dtype;
  int32_t state_dtype;
};

struct UpdateCall {
  std::vector<UpdateView> views;   // nonempty tensors only, in caller order
  std::vector<Tensor> keep_alive;  // contiguous copies of inputs given in another layout
  int64_t num_tensors = 0;         // T, empty tensors included
};

// Checks the op's arguments (one sentence per problem, naming the list and position) and describes them.
UpdateCall prepare_update_call(const std::vector<Tensor>& before, const std::vector<Tensor>& after,
                               const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg_sq);

// The outputs (counts, sums, amax: common/op.h's TallyOutputs) on `device`: zeroed (kZeroed, CPU only) or
// uninitialised.
TallyOutputs allocate_update_outputs(int64_t num_tensors, const Device& device, OutputFill fill = OutputFill::kZeroed);

// ---- for the CUDA kernel (the CUDA op, in _C_cuda, and the emulated op, in the test-only _C_emu) ----

// The checked call, its outputs, the views with their first chunks and the plan (common/op.h's TallyKernelCall).
using UpdateKernelCall = TallyKernelCall<UpdateCall, UpdateKernelView, UpdateLaunchPlan>;

// Describes a checked call for the kernel on `device`, in chunks of `chunk_elems` elements.
inline void plan_update_kernels(UpdateKernelCall& k, const Device& device, int64_t chunk_elems) {
  k.out = allocate_update_outputs(k.call.num_tensors, device, OutputFill::kUninitialised);
  k.views.clear();
  for (const UpdateView& v : k.call.views) {
    UpdateKernelView view{};
    view.before = v.before;
    view.after = v.after;
    view.grad = v.grad;
    view.state = v.state;
    view.numel = v.numel;
    view.out_row = v.out_row;
    view.weight_dtype = v.weight_dtype;
    view.grad_dtype = v.grad_dtype;
    view.state_dtype = v.state_dtype;
    k.views.push_back(view);
  }
  k.plan = UpdateLaunchPlan{};
  k.plan.views = k.views.data();
  k.plan.num_views = static_cast<int64_t>(k.views.size());
  k.plan.num_tensors = k.call.num_tensors;
  k.plan.chunk_elems = chunk_elems;
  k.plan.counts = static_cast<int64_t*>(k.out.counts.data_ptr());
  k.plan.sums = static_cast<double*>(k.out.sums.data_ptr());
  k.plan.amax = static_cast<float*>(k.out.amax.data_ptr());
}

}  // namespace amp_inspect
