// readiness_call.h: the host side of amp_inspect::format_readiness shared by its backends: the checked, torch-free
// description of a call (contiguous tensor views with their row length, the recipes asked for, the given tensor
// amaxes), the outputs, and the plan the CUDA kernels run on. The element logic the backends run on it is
// readiness.h.
//
// The op (schema in module.cpp):
//   format_readiness(Tensor[] tensors, int[] recipes, Tensor? tensor_amax) -> (Tensor counts, Tensor sums, Tensor amax)
//   counts int64   [T, 3 + 4R]  numel, nonzero, nonfinite, then per recipe flushed, saturated, blocks, scale_flushed
//   sums   float64 [T, 1 + R]   sq_signal, then sq_error per recipe
//   amax   float32 [T]          the tensor amax used: the given one, else the finite amax measured (0 when none)
// amp_inspect/core/statistics.py's READINESS entries are the same table, checked against _C.layout().
//
// Header-only (inline): each library compiles its own copy, in the one file of it that runs the op (the CPU kernel
// in _C, the CUDA op in _C_cuda, the emulated op in the test-only _C_emu).
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/op.h"
#include "readiness/readiness.h"

namespace amp_inspect {

// How the op's error sentences begin.
constexpr const char* kReadinessOp = "amp_inspect.format_readiness: ";

// One nonempty tensor as the readiness kernels read it: contiguous, its blocks along rows of `row_length`
// elements (the last dimension; 1 for a 0-d tensor).
struct ReadinessView {
  const void* data;
  int64_t numel;
  int64_t row_length;
  int64_t out_row;  // the tensor's position in the caller's list
  int32_t dtype;    // InputDtype: kFloat32, kFloat16 or kBFloat16
};

struct ReadinessCall {
  std::vector<ReadinessView> views;  // nonempty tensors only, in caller order
  std::vector<Tensor> keep_alive;    // contiguous copies of tensors given in another layout
  int64_t num_tensors = 0;           // T, empty tensors included
  int num_recipes = 0;               // R
  int32_t recipe_ids[kNumRecipes];   // indices into kRecipes, in the order asked
  bool needs_tensor_amax = false;    // a tensor-scaled recipe (fp32_tensor, nvfp4) is asked for
  const float* tensor_amax = nullptr;  // the given amaxes, [T] on the tensors' device; null: measured
};

namespace readiness_call_detail {

inline InputDtype readiness_dtype(const Tensor& t, size_t position) {
  const std::optional<InputDtype> dtype = input_dtype_of(t.scalar_type(), /*float64_too=*/false);
  AMPI_CHECK(dtype.has_value(), kReadinessOp, "tensor ", position, " has dtype ", t.scalar_type(),
             "; expected float32, bfloat16 or float16");
  return *dtype;
}

}  // namespace readiness_call_detail

// Checks the op's arguments (one sentence per problem, naming the tensor's position) and describes them.
inline ReadinessCall prepare_readiness_call(const std::vector<Tensor>& tensors, const std::vector<int64_t>& recipes,
                                            const std::optional<Tensor>& tensor_amax) {
  ReadinessCall call;
  call.num_tensors = static_cast<int64_t>(tensors.size());

  AMPI_CHECK(recipes.size() <= static_cast<size_t>(kNumRecipes), kReadinessOp, "at most ", kNumRecipes,
             " recipes (each once), got ", recipes.size());
  bool seen[kNumRecipes] = {};
  for (const int64_t id : recipes) {
    AMPI_CHECK(id >= 0 && id < kNumRecipes, kReadinessOp, "recipe index ", id, " is out of range; there are ",
               kNumRecipes, " recipes (amp_inspect.core.recipes.RECIPES)");
    AMPI_CHECK(!seen[id], kReadinessOp, "recipe ", kRecipes[id].name, " (index ", id, ") is asked for twice");
    seen[id] = true;
    call.recipe_ids[call.num_recipes++] = static_cast<int32_t>(id);
    call.needs_tensor_amax = call.needs_tensor_amax || needs_tensor_amax(kRecipes[id].scale);
  }

  std::optional<Device> device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    AMPI_CHECK(t.defined(), kReadinessOp, "tensor ", i, " is undefined (None)");
    AMPI_CHECK(is_strided(t, kReadinessOp), kReadinessOp, "tensor ", i,
               " is not a dense (strided) tensor; only dense tensors are supported");
    readiness_call_detail::readiness_dtype(t, i);
    if (!device) device = t.device();
    AMPI_CHECK(same_device(t.device(), *device), kReadinessOp, "tensor ", i, " is on ", device_name(t.device()),
               " but tensor 0 is on ", device_name(*device), "; the op takes one device per call");
  }

  if (tensor_amax.has_value()) {
    const Tensor& a = *tensor_amax;
    AMPI_CHECK(a.scalar_type() == ScalarType::Float && a.dim() == 1 && a.size(0) == call.num_tensors, kReadinessOp,
               "tensor_amax must be a float32 tensor of shape [", call.num_tensors,
               "] (one amax per tensor), got dtype ", a.scalar_type(), " and ", a.dim(), " dims of ", a.numel(),
               " elements");
    if (device) {
      AMPI_CHECK(same_device(a.device(), *device), kReadinessOp, "tensor_amax is on ", device_name(a.device()),
                 " but the tensors are on ", device_name(*device));
    }
    Tensor contiguous = torch::stable::contiguous(a);
    call.keep_alive.push_back(contiguous);
    call.tensor_amax = static_cast<const float*>(contiguous.data_ptr());
    if (a.is_cpu()) {  // reading it costs no sync here
      for (int64_t t = 0; t < call.num_tensors; ++t) {
        const float v = call.tensor_amax[t];
        // (Inf and NaN are accepted: a stale amax of those gives the unit scale, core/recipes.py)
        AMPI_CHECK(!(v < 0), kReadinessOp, "tensor_amax[", t, "] is ", v, "; an amax is >= 0");
      }
    }
  }

  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (t.numel() == 0) continue;
    // Blocks run along the last dimension as given, so the kernels read the tensor in its logical order.
    Tensor contiguous = torch::stable::contiguous(t);
    if (contiguous.data_ptr() != t.data_ptr()) call.keep_alive.push_back(contiguous);
    ReadinessView view{};
    view.data = contiguous.data_ptr();
    view.numel = t.numel();
    view.row_length = t.dim() == 0 ? 1 : t.size(t.dim() - 1);
    view.out_row = static_cast<int64_t>(i);
    view.dtype = readiness_call_detail::readiness_dtype(t, i);
    call.views.push_back(view);
  }
  return call;
}

// The outputs (counts, sums, amax: common/op.h's TallyOutputs) on `device`: zeroed (kZeroed, CPU only) or
// uninitialised.
inline TallyOutputs allocate_readiness_outputs(int64_t num_tensors, int num_recipes, const Device& device,
                                               OutputFill fill = OutputFill::kZeroed) {
  return allocate_tally_outputs(num_tensors, readiness_count_columns(num_recipes), readiness_sum_columns(num_recipes),
                                device, fill, kReadinessOp);
}

// ---- for the CUDA kernels (the CUDA op, in _C_cuda, and the emulated op, in the test-only _C_emu) ----

// The checked call, its outputs, the views with their work geometry, grouped by dtype, and the plan tying them
// together (common/op.h's TallyKernelCall).
using ReadinessKernelCall = TallyKernelCall<ReadinessCall, ReadinessKernelView, ReadinessLaunchPlan>;

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
