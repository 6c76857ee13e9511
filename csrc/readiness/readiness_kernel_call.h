// readiness_kernel_call.h: the host side of format readiness's CUDA kernels, shared by the CUDA op
// (readiness_cuda_op.cpp, in _C_cuda) and the emulated op (readiness_emu.cpp, in the test-only _C_emu): the
// outputs and the torch-free plan readiness_kernels.cuh launches, from the checked call of readiness_call.h (the
// CPU op's). Stable ABI only. Header-only (inline): each library compiles its own copy.
#pragma once

#include <vector>

#include "readiness/readiness.h"
#include "readiness/readiness_call.h"
#include "readiness/readiness_launch.h"
#include "common/op.h"

namespace amp_inspect {

// What a launch needs for one call: the outputs (uninitialised: the launch sequence zeroes them), the views
// with their work geometry, grouped by dtype, and the plan tying them together. The checked call (its
// contiguous copies kept alive until the launches are queued: the caching allocator hands their memory only to
// work queued later) is readiness_call.cpp's prepare_readiness_call, the CPU op's own.
struct ReadinessKernelCall {
  ReadinessCall call;
  TallyOutputs out;
  std::vector<ReadinessKernelView> views;
  ReadinessLaunchPlan plan;
};

// Describes a checked call for the kernels on `device`, in work chunks of `chunk_tasks` warp tasks.
inline void plan_readiness_kernels(ReadinessKernelCall& k, const Device& device, int64_t chunk_tasks) {
  const ReadinessCall& call = k.call;
  k.out = allocate_readiness_outputs(call.num_tensors, call.num_recipes, device, OutputFill::kUninitialised);
  ReadinessLaunchPlan& plan = k.plan;
  plan = ReadinessLaunchPlan{};
  for (int r = 0; r < kReadinessMaxRecipes; ++r) plan.slot_of_recipe[r] = -1;
  for (int s = 0; s < call.num_recipes; ++s) plan.slot_of_recipe[call.recipe_ids[s]] = s;
  plan.num_recipes = call.num_recipes;
  plan.tensor_scaled_asked = call.needs_tensor_amax;
  plan.tensor_amax = call.tensor_amax;
  plan.num_tensors = call.num_tensors;
  plan.chunk_tasks = chunk_tasks;
  // One launch per run of a dtype: the views grouped by dtype, stably (the outputs do not depend on the order).
  k.views.clear();
  for (int32_t dtype : {kFloat32, kFloat16, kBFloat16}) {
    for (const ReadinessView& v : call.views) {
      if (v.dtype != dtype) continue;
      ReadinessKernelView view{};
      view.data = v.data;
      view.out_row = v.out_row;
      view.dtype = v.dtype;
      set_readiness_geometry(view, v.numel, v.row_length);
      k.views.push_back(view);
    }
  }
  plan.views = k.views.data();
  plan.num_views = static_cast<int64_t>(k.views.size());
  plan.counts = static_cast<int64_t*>(k.out.counts.data_ptr());
  plan.sums = static_cast<double*>(k.out.sums.data_ptr());
  plan.amax = static_cast<float*>(k.out.amax.data_ptr());
}

}  // namespace amp_inspect
