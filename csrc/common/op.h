// op.h: the host side every op shares, whatever runs its kernels: the error helper, device names, the input
// checks every op makes (layout, dtype), and the allocation of outputs. Built into every library (op.cpp).
//
// Written against torch's stable ABI only (torch::stable::Tensor, the C shim; TORCH_TARGET_VERSION 2.10 is set
// by setup.py), so that one binary loads on every torch from 2.10 on: no ATen or c10 header is included.
#pragma once

#include <torch/csrc/stable/device.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/numerics.h"

namespace amp_inspect {

using Tensor = torch::stable::Tensor;
using Device = torch::stable::Device;
using ScalarType = torch::headeronly::ScalarType;
using DeviceType = torch::headeronly::DeviceType;

// The ops' errors, one sentence each: a std::runtime_error, which torch raises as RuntimeError. (The stable
// ABI's STD_TORCH_CHECK would prefix each message with the C++ function, file and line.) Each op begins its
// sentences with its name and a colon ("amp_inspect.format_readiness: "): the `op` the helpers below take.
template <class... Args>
[[noreturn]] void fail(const Args&... args) {
  std::ostringstream message;
  (message << ... << args);
  throw std::runtime_error(message.str());
}
#define AMPI_CHECK(cond, ...)                             \
  do {                                                    \
    if (!(cond)) ::amp_inspect::fail(__VA_ARGS__);        \
  } while (false)

// "cpu", "cuda:0", "meta": a device as torch prints it (the stable Device has no operator<<).
std::string device_name(const Device& device);
bool same_device(const Device& a, const Device& b);

// Whether `t` is a dense (strided) tensor. Tensor::layout() is in the stable headers from torch 2.11 only; the C
// shim's call is older.
bool is_strided(const Tensor& t, const char* op);

// The InputDtype a kernel reads a torch dtype as: float32, float16, bfloat16, and float64 where `float64_too`;
// none for any other (each op says which it takes, in its own sentence).
std::optional<InputDtype> input_dtype_of(ScalarType dtype, bool float64_too);

// An uninitialised contiguous tensor (torch::stable::empty); pinned only for CPU tensors.
Tensor empty_tensor(const std::vector<int64_t>& shape, ScalarType dtype, const Device& device, bool pinned = false);

// An output on `device`: filled with `neutral` (the value of a tensor without elements: the identity of the
// statistic's merge), ready for kernels that accumulate into it, or left uninitialised for kernels that write (or
// zero) every element themselves. Filled on the host memory rather than with zero_/fill_ ops: no dispatcher round
// trip per output; so kZeroed is for CPU outputs only.
enum class OutputFill { kZeroed, kUninitialised };
Tensor allocate_output(const std::vector<int64_t>& shape, ScalarType dtype, const Device& device, OutputFill fill,
                       double neutral, const char* op);

// The outputs of the ops that tally each tensor's elements (format_readiness, update_stats; a new op of this kind
// returns the same three): T = number of tensors,
//   counts int64   [T, C]  the op's count columns
//   sums   float64 [T, S]  the op's sum columns
//   amax   float32 [T]     a finite amax (0 when none)
// Zeroed (kZeroed) they hold a tensor without elements.
struct TallyOutputs {
  Tensor counts;
  Tensor sums;
  Tensor amax;

  // As the op returns them: (counts, sums, amax).
  std::tuple<Tensor, Tensor, Tensor> returned() const { return {counts, sums, amax}; }
};
// Their names and dtypes, in the op's order, as amp_inspect._C.layout() reports them.
struct TallyOutputSpec {
  const char* name;
  ScalarType dtype;
};
constexpr int kNumTallyOutputs = 3;
constexpr TallyOutputSpec kTallyOutputs[kNumTallyOutputs] = {
    {"counts", ScalarType::Long},
    {"sums", ScalarType::Double},
    {"amax", ScalarType::Float},
};
TallyOutputs allocate_tally_outputs(int64_t num_tensors, int64_t count_columns, int64_t sum_columns,
                                    const Device& device, OutputFill fill, const char* op);

// What a tallying op's CUDA kernels (on a GPU, or emulated) need for one call, from the checked call its CPU kernel
// runs on: the call (its contiguous copies kept alive until the launches are queued: the caching allocator hands
// their memory only to work queued later), the outputs (uninitialised: the launch sequence zeroes them), the views
// as the kernels read them, and the torch-free plan tying them together. Each op's plan_*_kernels fills it.
template <class Call, class KernelView, class LaunchPlan>
struct TallyKernelCall {
  Call call;
  TallyOutputs out;
  std::vector<KernelView> views;
  LaunchPlan plan;
};

}  // namespace amp_inspect
