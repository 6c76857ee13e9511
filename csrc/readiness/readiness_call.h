// readiness_call.h: the host side of amp_inspect::format_readiness shared by its backends: the checked, torch-free
// description of a call (contiguous tensor views with their row length, the recipes asked for, the given tensor
// amaxes) and the outputs. The element logic the backends run on it is readiness.h.
//
// The op (schema in module.cpp):
//   format_readiness(Tensor[] tensors, int[] recipes, Tensor? tensor_amax) -> (Tensor counts, Tensor sums, Tensor amax)
//   counts int64   [T, 3 + 4R]  numel, nonzero, nonfinite, then per recipe flushed, saturated, blocks, scale_flushed
//   sums   float64 [T, 1 + R]   sq_signal, then sq_error per recipe
//   amax   float32 [T]          the tensor amax used: the given one, else the finite amax measured (0 when none)
// amp_inspect/core/statistics.py's READINESS entries are the same table, checked against _C.layout().
#pragma once

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

// Checks the op's arguments (one sentence per problem, naming the tensor's position) and describes them.
ReadinessCall prepare_readiness_call(const std::vector<Tensor>& tensors, const std::vector<int64_t>& recipes,
                                     const std::optional<Tensor>& tensor_amax);

// The outputs (counts, sums, amax: common/op.h's TallyOutputs) on `device`: zeroed (kZeroed, CPU only) or
// uninitialised.
TallyOutputs allocate_readiness_outputs(int64_t num_tensors, int num_recipes, const Device& device,
                                        OutputFill fill = OutputFill::kZeroed);

}  // namespace amp_inspect
