// readiness_kernel_call.h: the host side of format readiness's CUDA kernels, shared by the CUDA op
// (readiness_cuda_op.cpp, in _C_cuda) and the emulated op (readiness_emu.cpp, in the test-only _C_emu): the
// input checks, the outputs, and the torch-free plan readiness_kernels.cuh launches. Stable ABI only.
// Header-only (inline): each library compiles its own copy, as both hold their own tensor_stats_call.cpp.
#pragma once

#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "readiness.h"
#include "readiness_launch.h"
#include "tensor_stats.h"

namespace amp_inspect {

// What a launch needs for one call: the outputs (uninitialised: the launch sequence zeroes them), the views
// grouped by dtype, the contiguous copies they read (kept alive until the launches are queued: the caching
// allocator hands their memory to nothing queued earlier), and the plan tying them together.
struct ReadinessKernelCall {
  Tensor counts;
  Tensor sums;
  Tensor amax;
  std::vector<ReadinessKernelView> views;
  std::vector<Tensor> keep_alive;
  ReadinessLaunchPlan plan;
};

inline int32_t readiness_input_dtype(const Tensor& t, const char* op, size_t position) {
  switch (t.scalar_type()) {
    case ScalarType::Float:
      return kFloat32;
    case ScalarType::Half:
      return kFloat16;
    case ScalarType::BFloat16:
      return kBFloat16;
    default:
      fail(op, ": tensor ", position, " has dtype ", t.scalar_type(), "; expected float32, float16 or bfloat16");
  }
}

// Checks the arguments (one sentence each, naming the offending position) and describes them for the kernels
// on `device`, in work chunks of `chunk_tasks` warp tasks.
inline ReadinessKernelCall prepare_readiness(const std::vector<Tensor>& tensors, const std::vector<int64_t>& recipes,
                                             const std::optional<Tensor>& tensor_amax, const Device& device,
                                             int64_t chunk_tasks, const char* op) {
  ReadinessKernelCall k;
  ReadinessLaunchPlan& plan = k.plan;
  plan = ReadinessLaunchPlan{};
  const int64_t num_tensors = static_cast<int64_t>(tensors.size());
  AMPI_CHECK(!recipes.empty(), op, ": recipes must name at least one recipe");
  AMPI_CHECK(recipes.size() <= static_cast<size_t>(kReadinessMaxRecipes), op, ": at most ", kReadinessMaxRecipes,
             " recipes, got ", recipes.size());
  for (int r = 0; r < kReadinessMaxRecipes; ++r) plan.slot_of_recipe[r] = -1;
  for (size_t s = 0; s < recipes.size(); ++s) {
    const int64_t r = recipes[s];
    AMPI_CHECK(r >= 0 && r < kReadinessMaxRecipes, op, ": recipe index ", r, " is not in [0, ", kReadinessMaxRecipes,
               ")");
    AMPI_CHECK(plan.slot_of_recipe[r] < 0, op, ": recipe index ", r, " is listed twice");
    plan.slot_of_recipe[r] = static_cast<int32_t>(s);
    plan.tensor_scaled_asked |= needs_tensor_amax(kRecipes[r].scale);
  }
  plan.num_recipes = static_cast<int32_t>(recipes.size());
  plan.num_tensors = num_tensors;
  plan.chunk_tasks = chunk_tasks;

  std::vector<ReadinessKernelView> views;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    AMPI_CHECK(t.defined(), op, ": tensor ", i, " is undefined (None)");
    const int32_t dtype = readiness_input_dtype(t, op, i);
    AMPI_CHECK(same_device(t.device(), device), op, ": tensor ", i, " is on ", device_name(t.device()),
               " but tensor 0 is on ", device_name(device), "; the op takes one device per call");
    const int64_t numel = t.numel();
    if (numel == 0) continue;
    ReadinessKernelView view{};
    Tensor dense = t;
    if (!t.is_contiguous()) {  // blocks run along the last dim as given: read a contiguous copy
      dense = torch::stable::contiguous(t);
      k.keep_alive.push_back(dense);
    }
    view.data = dense.data_ptr();
    view.out_row = static_cast<int64_t>(i);
    view.dtype = dtype;
    set_readiness_geometry(view, numel, t.dim() == 0 ? 1 : t.size(t.dim() - 1));
    views.push_back(view);
  }
  if (tensor_amax.has_value()) {
    const Tensor& a = *tensor_amax;
    AMPI_CHECK(a.scalar_type() == ScalarType::Float && a.dim() == 1 && a.numel() == num_tensors, op,
               ": tensor_amax must be a float32 tensor of shape [", num_tensors, "] (one per tensor)");
    AMPI_CHECK(same_device(a.device(), device), op, ": tensor_amax is on ", device_name(a.device()),
               " but the tensors are on ", device_name(device));
    Tensor dense = a.is_contiguous() ? a : torch::stable::contiguous(a);
    k.keep_alive.push_back(dense);
    plan.tensor_amax = static_cast<const float*>(dense.data_ptr());
  }
  // One launch per run of a dtype: group the views by dtype, stably (the outputs do not depend on the order).
  for (int32_t dtype : {kFloat32, kFloat16, kBFloat16}) {
    for (const ReadinessKernelView& v : views) {
      if (v.dtype == dtype) k.views.push_back(v);
    }
  }
  plan.views = k.views.data();
  plan.num_views = static_cast<int64_t>(k.views.size());

  k.counts = empty_tensor({num_tensors, readiness_count_columns(plan.num_recipes)}, ScalarType::Long, device);
  k.sums = empty_tensor({num_tensors, readiness_sum_columns(plan.num_recipes)}, ScalarType::Double, device);
  k.amax = empty_tensor({num_tensors}, ScalarType::Float, device);
  plan.counts = static_cast<int64_t*>(k.counts.data_ptr());
  plan.sums = static_cast<double*>(k.sums.data_ptr());
  plan.amax = static_cast<float*>(k.amax.data_ptr());
  return k;
}

}  // namespace amp_inspect
