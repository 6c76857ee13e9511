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
//
// Header-only (inline): each library compiles its own copy, in the one file of it that runs the op (the CPU kernel
// in _C, the CUDA op in _C_cuda, the emulated op in the test-only _C_emu).
#pragma once

#include <torch/csrc/stable/ops.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "common/op.h"
#include "update_stats/update_stats.h"

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

namespace update_call_detail {

inline int32_t update_dtype(const Tensor& t, const char* list, size_t position) {
  const std::optional<InputDtype> dtype = input_dtype_of(t.scalar_type(), /*float64_too=*/false);
  AMPI_CHECK(dtype.has_value(), kUpdateOp, list, "[", position, "] has dtype ", t.scalar_type(),
             "; expected float32, bfloat16 or float16");
  return *dtype;
}

inline bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

}  // namespace update_call_detail

// Checks the op's arguments (one sentence per problem, naming the list and position) and describes them.
inline UpdateCall prepare_update_call(const std::vector<Tensor>& before, const std::vector<Tensor>& after,
                                      const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg_sq) {
  UpdateCall call;
  const size_t n = before.size();
  call.num_tensors = static_cast<int64_t>(n);
  AMPI_CHECK(after.size() == n && grads.size() == n && (exp_avg_sq.empty() || exp_avg_sq.size() == n), kUpdateOp,
             "before, after and grads must hold one tensor per parameter each (and exp_avg_sq none or as many), got ",
             n, ", ", after.size(), ", ", grads.size(), " and ", exp_avg_sq.size());
  const bool has_state = !exp_avg_sq.empty();
  std::optional<Device> device;
  const auto check = [&](const Tensor& t, const char* list, size_t i) {
    AMPI_CHECK(t.defined(), kUpdateOp, list, "[", i, "] is undefined (None)");
    AMPI_CHECK(is_strided(t, kUpdateOp), kUpdateOp, list, "[", i,
               "] is not a dense (strided) tensor; only dense tensors are supported");
    AMPI_CHECK(update_call_detail::same_shape(t, before[i]), kUpdateOp, list, "[", i,
               "] has another shape than before[", i, "]");
    if (!device) device = t.device();
    AMPI_CHECK(same_device(t.device(), *device), kUpdateOp, list, "[", i, "] is on ", device_name(t.device()),
               " but before[0] is on ", device_name(*device), "; the op takes one device per call");
    return update_call_detail::update_dtype(t, list, i);
  };
  for (size_t i = 0; i < n; ++i) {
    AMPI_CHECK(before[i].defined(), kUpdateOp, "before[", i, "] is undefined (None)");
    UpdateView view{};
    view.weight_dtype = check(before[i], "before", i);
    AMPI_CHECK(check(after[i], "after", i) == view.weight_dtype, kUpdateOp, "after[", i,
               "] has another dtype than before[", i, "]; a step keeps the dtype");
    view.grad_dtype = check(grads[i], "grads", i);
    view.state_dtype = has_state ? check(exp_avg_sq[i], "exp_avg_sq", i) : kFloat32;
    view.numel = before[i].numel();
    view.out_row = static_cast<int64_t>(i);
    if (view.numel == 0) continue;
    const auto data = [&](const Tensor& t) {
      Tensor contiguous = torch::stable::contiguous(t);
      if (contiguous.data_ptr() != t.data_ptr()) call.keep_alive.push_back(contiguous);
      return static_cast<const void*>(contiguous.data_ptr());
    };
    view.before = data(before[i]);
    view.after = data(after[i]);
    view.grad = data(grads[i]);
    view.state = has_state ? data(exp_avg_sq[i]) : nullptr;
    call.views.push_back(view);
  }
  return call;
}

// The outputs (counts, sums, amax: common/op.h's TallyOutputs) on `device`: zeroed (kZeroed, CPU only) or
// uninitialised.
inline TallyOutputs allocate_update_outputs(int64_t num_tensors, const Device& device,
                                            OutputFill fill = OutputFill::kZeroed) {
  return allocate_tally_outputs(num_tensors, kUpdateCountColumns, kUpdateSumColumns, device, fill, kUpdateOp);
}

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
