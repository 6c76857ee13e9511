// readiness_call.cpp: the input checks and outputs of amp_inspect::format_readiness (readiness_call.h). Stable ABI
// only; built into every library that holds a format_readiness kernel.
#include "readiness/readiness_call.h"

#include <torch/csrc/stable/ops.h>

#include <string>

namespace amp_inspect {
namespace {

constexpr const char* kOp = kReadinessOp;

InputDtype readiness_dtype(const Tensor& t, size_t position) {
  const std::optional<InputDtype> dtype = input_dtype_of(t.scalar_type(), /*float64_too=*/false);
  AMPI_CHECK(dtype.has_value(), kOp, "tensor ", position, " has dtype ", t.scalar_type(),
             "; expected float32, bfloat16 or float16");
  return *dtype;
}

}  // namespace

ReadinessCall prepare_readiness_call(const std::vector<Tensor>& tensors, const std::vector<int64_t>& recipes,
                                     const std::optional<Tensor>& tensor_amax) {
  ReadinessCall call;
  call.num_tensors = static_cast<int64_t>(tensors.size());

  AMPI_CHECK(recipes.size() <= static_cast<size_t>(kNumRecipes), kOp, "at most ", kNumRecipes,
             " recipes (each once), got ", recipes.size());
  bool seen[kNumRecipes] = {};
  for (const int64_t id : recipes) {
    AMPI_CHECK(id >= 0 && id < kNumRecipes, kOp, "recipe index ", id, " is out of range; there are ", kNumRecipes,
               " recipes (amp_inspect.core.recipes.RECIPES)");
    AMPI_CHECK(!seen[id], kOp, "recipe ", kRecipes[id].name, " (index ", id, ") is asked for twice");
    seen[id] = true;
    call.recipe_ids[call.num_recipes++] = static_cast<int32_t>(id);
    call.needs_tensor_amax = call.needs_tensor_amax || needs_tensor_amax(kRecipes[id].scale);
  }

  std::optional<Device> device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    AMPI_CHECK(t.defined(), kOp, "tensor ", i, " is undefined (None)");
    AMPI_CHECK(is_strided(t, kOp), kOp, "tensor ", i, " is not a dense (strided) tensor; only dense tensors are supported");
    readiness_dtype(t, i);
    if (!device) device = t.device();
    AMPI_CHECK(same_device(t.device(), *device), kOp, "tensor ", i, " is on ", device_name(t.device()),
               " but tensor 0 is on ", device_name(*device), "; the op takes one device per call");
  }

  if (tensor_amax.has_value()) {
    const Tensor& a = *tensor_amax;
    AMPI_CHECK(a.scalar_type() == ScalarType::Float && a.dim() == 1 && a.size(0) == call.num_tensors, kOp,
               "tensor_amax must be a float32 tensor of shape [", call.num_tensors, "] (one amax per tensor), got dtype ",
               a.scalar_type(), " and ", a.dim(), " dims of ", a.numel(), " elements");
    if (device) {
      AMPI_CHECK(same_device(a.device(), *device), kOp, "tensor_amax is on ", device_name(a.device()),
                 " but the tensors are on ", device_name(*device));
    }
    Tensor contiguous = torch::stable::contiguous(a);
    call.keep_alive.push_back(contiguous);
    call.tensor_amax = static_cast<const float*>(contiguous.data_ptr());
    if (a.is_cpu()) {  // reading it costs no sync here
      for (int64_t t = 0; t < call.num_tensors; ++t) {
        const float v = call.tensor_amax[t];
        // (Inf and NaN are accepted: a stale amax of those gives the unit scale, core/recipes.py)
        AMPI_CHECK(!(v < 0), kOp, "tensor_amax[", t, "] is ", v, "; an amax is >= 0");
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
    view.dtype = readiness_dtype(t, i);
    call.views.push_back(view);
  }
  return call;
}

TallyOutputs allocate_readiness_outputs(int64_t num_tensors, int num_recipes, const Device& device, OutputFill fill) {
  return allocate_tally_outputs(num_tensors, readiness_count_columns(num_recipes), readiness_sum_columns(num_recipes),
                                device, fill, kOp);
}

}  // namespace amp_inspect
