// op.cpp: the host side every op shares (op.h). Stable ABI only; built into every library: _C (the CPU kernels),
// _C_cuda (the CUDA kernels) and the test-only _C_emu (the emulated ones).
#include "common/op.h"

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/core/Layout.h>

#include <algorithm>

namespace amp_inspect {
namespace {

// Every element of a host tensor set to `value`, in the tensor's dtype (one of the outputs' dtypes). Zero is
// all-zero bits in each of them.
void fill_host(const Tensor& t, double value) {
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case ScalarType::Long:
      std::fill_n(static_cast<int64_t*>(t.data_ptr()), n, static_cast<int64_t>(value));
      break;
    case ScalarType::Float:
      std::fill_n(static_cast<float*>(t.data_ptr()), n, static_cast<float>(value));
      break;
    case ScalarType::Double:
      std::fill_n(static_cast<double*>(t.data_ptr()), n, value);
      break;
    default:
      fail("amp_inspect: an output of dtype ", t.scalar_type(), " cannot be filled");
  }
}

}  // namespace

std::string device_name(const Device& device) {
  std::string name;
  switch (device.type()) {
    case DeviceType::CPU:
      return "cpu";
    case DeviceType::CUDA:
      name = "cuda";
      break;
    case DeviceType::Meta:
      return "meta";
    default:
      name = "device type " + std::to_string(static_cast<int>(device.type()));
  }
  return device.has_index() ? name + ":" + std::to_string(device.index()) : name;
}

bool same_device(const Device& a, const Device& b) { return a.type() == b.type() && a.index() == b.index(); }

bool is_strided(const Tensor& t, const char* op) {
  int32_t layout = -1;
  AMPI_CHECK(aoti_torch_get_layout(t.get(), &layout) == AOTI_TORCH_SUCCESS, op, "could not read a tensor's layout");
  return layout == aoti_torch_layout_strided();
}

std::optional<InputDtype> input_dtype_of(ScalarType dtype, bool float64_too) {
  switch (dtype) {
    case ScalarType::Float:
      return kFloat32;
    case ScalarType::Half:
      return kFloat16;
    case ScalarType::BFloat16:
      return kBFloat16;
    case ScalarType::Double:
      if (float64_too) return kFloat64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

Tensor empty_tensor(const std::vector<int64_t>& shape, ScalarType dtype, const Device& device, bool pinned) {
  return torch::stable::empty(shape, dtype, torch::headeronly::Layout::Strided, device,
                              pinned ? std::optional<bool>(true) : std::nullopt);
}

Tensor allocate_output(const std::vector<int64_t>& shape, ScalarType dtype, const Device& device, OutputFill fill,
                       double neutral, const char* op) {
  AMPI_CHECK(fill != OutputFill::kZeroed || device.type() == DeviceType::CPU, op,
             "zeroed outputs are made on the CPU only");
  Tensor t = empty_tensor(shape, dtype, device);
  if (fill == OutputFill::kZeroed) fill_host(t, neutral);
  return t;
}

TallyOutputs allocate_tally_outputs(int64_t num_tensors, int64_t count_columns, int64_t sum_columns,
                                    const Device& device, OutputFill fill, const char* op) {
  static_assert(kNumTallyOutputs == 3, "counts, sums, amax");
  constexpr double kZero = 0.0;  // each output of a tensor without elements
  TallyOutputs out;
  out.counts = allocate_output({num_tensors, count_columns}, kTallyOutputs[0].dtype, device, fill, kZero, op);
  out.sums = allocate_output({num_tensors, sum_columns}, kTallyOutputs[1].dtype, device, fill, kZero, op);
  out.amax = allocate_output({num_tensors}, kTallyOutputs[2].dtype, device, fill, kZero, op);
  return out;
}

}  // namespace amp_inspect
