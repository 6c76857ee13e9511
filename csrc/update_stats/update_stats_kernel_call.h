// update_stats_kernel_call.h: the host side of update_stats' CUDA kernel, shared by the CUDA op
// (update_stats_cuda_op.cpp, in _C_cuda) and the emulated op (update_stats_emu.cpp, in the test-only _C_emu): the
// outputs and the torch-free plan update_stats_kernels.cuh launches, from the checked call of update_stats_call.h
// (the CPU op's). Stable ABI only. Header-only (inline): each library compiles its own copy.
#pragma once

#include <vector>

#include "update_stats/update_stats_call.h"
#include "update_stats/update_stats_launch.h"

namespace amp_inspect {

// What a launch needs for one call: the checked call (its contiguous copies kept alive until the launches are
// queued), the outputs (uninitialised: the launch sequence zeroes them), the views and the plan.
struct UpdateKernelCall {
  UpdateCall call;
  TallyOutputs out;
  std::vector<UpdateKernelView> views;
  UpdateLaunchPlan plan;
};

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
