// update_stats_call.cpp: the input checks and outputs of amp_inspect::update_stats (update_stats_call.h). Stable
// ABI only; built into every library that holds an update_stats kernel.
#include "update_stats/update_stats_call.h"

#include <torch/csrc/stable/ops.h>

#include <optional>

namespace amp_inspect {
namespace {

constexpr const char* kOp = kUpdateOp;

int32_t update_dtype(const Tensor& t, const char* list, size_t position) {
  const std::optional<InputDtype> dtype = input_dtype_of(t.scalar_type(), /*float64_too=*/false);
  AMPI_CHECK(dtype.has_value(), kOp, list, "[", position, "] has dtype ", t.scalar_type(),
             "; expected float32, bfloat16 or float16");
  return *dtype;
}

bool same_shape(const Tensor& a, const Tensor& b) {
  if (a.dim() != b.dim()) return false;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.size(d) != b.size(d)) return false;
  }
  return true;
}

}  // namespace

UpdateCall prepare_update_call(const std::vector<Tensor>& before, const std::vector<Tensor>& after,
                               const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg_sq) {
  UpdateCall call;
  const size_t n = before.size();
  call.num_tensors = static_cast<int64_t>(n);
  AMPI_CHECK(after.size() == n && grads.size() == n && (exp_avg_sq.empty() || exp_avg_sq.size() == n), kOp,
             "before, after and grads must hold one tensor per parameter each (and exp_avg_sq none or as many), got ",
             n, ", ", after.size(), ", ", grads.size(), " and ", exp_avg_sq.size());
  const bool has_state = !exp_avg_sq.empty();
  std::optional<Device> device;
  const auto check = [&](const Tensor& t, const char* list, size_t i) {
    AMPI_CHECK(t.defined(), kOp, list, "[", i, "] is undefined (None)");
    AMPI_CHECK(is_strided(t, kOp), kOp, list, "[", i, "] is not a dense (strided) tensor; only dense tensors are supported");
    AMPI_CHECK(same_shape(t, before[i]), kOp, list, "[", i, "] has another shape than before[", i, "]");
    if (!device) device = t.device();
    AMPI_CHECK(same_device(t.device(), *device), kOp, list, "[", i, "] is on ", device_name(t.device()),
               " but before[0] is on ", device_name(*device), "; the op takes one device per call");
    return update_dtype(t, list, i);
  };
  for (size_t i = 0; i < n; ++i) {
    AMPI_CHECK(before[i].defined(), kOp, "before[", i, "] is undefined (None)");
    UpdateView view{};
    view.weight_dtype = check(before[i], "before", i);
    AMPI_CHECK(check(after[i], "after", i) == view.weight_dtype, kOp, "after[", i, "] has another dtype than before[",
               i, "]; a step keeps the dtype");
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

TallyOutputs allocate_update_outputs(int64_t num_tensors, const Device& device, OutputFill fill) {
  return allocate_tally_outputs(num_tensors, kUpdateCountColumns, kUpdateSumColumns, device, fill, kOp);
}

}  // namespace amp_inspect
