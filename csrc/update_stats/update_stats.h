// update_stats.h: the element logic of amp_inspect::update_stats (issue 22), what optimizer.step() did to one
// element of a parameter, written once for the CPU kernel (update_stats_cpu.cpp) and the CUDA one
// (update_stats_kernels.cuh); at the end, the plan the host hands the CUDA kernel.
//
// Torch-free, __host__ __device__. Every input (before, after, grad, exp_avg_sq; float32, bfloat16 or float16) is
// widened exactly to float32 bits by numerics.h's loaders, and every test is an integer compare on those bits:
// exact and immune to flush-to-zero modes. Definitions (amp_inspect/core/statistics.py `UPDATE`, the same table):
//   with_grad        : grad finite and nonzero
//   lost             : with_grad and after == before as values (+0 == -0; NaN equals nothing)
//   changed          : not (after == before as values): NaN counts as changed
//   weight_nonfinite : after is NaN or Inf
//   weight_subnormal : after is nonzero and below the smallest normal of the parameter's dtype
//   state_underflow  : with_grad and exp_avg_sq below the smallest normal of its dtype (zero included)
//   made_nonfinite   : before and grad finite and after NaN or Inf: the step itself made the weight non-finite
//   sq_change        : (after - before)^2 in float64, where both are finite
//   sq_weight        : before^2 in float64, where before is finite
//   amax             : max |after| over finite after, kept as |bits| (monotone in the value for finite floats)
#pragma once

#include <cstdint>

#include "common/numerics.h"

namespace amp_inspect {

// The counts output's columns, in the order of core/statistics.py's UPDATE (checked through _C.layout()).
enum UpdateCount : int32_t {
  kUpdNumel = 0,
  kUpdWithGrad,
  kUpdLost,
  kUpdChanged,
  kUpdWeightNonfinite,
  kUpdWeightSubnormal,
  kUpdStateUnderflow,
  kUpdMadeNonfinite,
};
enum UpdateSum : int32_t { kUpdSqChange = 0, kUpdSqWeight };
constexpr int kUpdateCountColumns = kUpdMadeNonfinite + 1;
constexpr int kUpdateSumColumns = kUpdSqWeight + 1;
constexpr const char* kUpdateCountNames[kUpdateCountColumns] = {
    "numel",           "with_grad",       "lost",          "changed", "weight_nonfinite",
    "weight_subnormal", "state_underflow", "made_nonfinite"};
constexpr const char* kUpdateSumNames[kUpdateSumColumns] = {"sq_change", "sq_weight"};

// The smallest normal of an input dtype as float32 |bits|: float32 and bfloat16 share float32's exponent range
// (2^-126); float16's is 2^-14. A widened value below it (and nonzero) is a subnormal of its own dtype.
AMPI_HD uint32_t min_normal_bits(int32_t dtype) { return dtype == kFloat16 ? 0x38800000u : 0x00800000u; }

// The totals of some elements of one tensor, merged by adding (amax by max).
struct UpdateTally {
  int64_t counts[kUpdateCountColumns];  // kUpdNumel is filled by the caller from the tensor's size
  double sums[kUpdateSumColumns];
  uint32_t amax_bits;
};

AMPI_HD void clear_tally(UpdateTally& t) {
  for (int k = 0; k < kUpdateCountColumns; ++k) t.counts[k] = 0;
  for (int k = 0; k < kUpdateSumColumns; ++k) t.sums[k] = 0.0;
  t.amax_bits = 0u;
}

AMPI_HD void merge_tally(UpdateTally& into, const UpdateTally& from) {
  for (int k = 0; k < kUpdateCountColumns; ++k) into.counts[k] += from.counts[k];
  for (int k = 0; k < kUpdateSumColumns; ++k) into.sums[k] += from.sums[k];
  into.amax_bits = into.amax_bits > from.amax_bits ? into.amax_bits : from.amax_bits;
}

// The judgement of one element, all four inputs as float32 bits (`state` ignored without `has_state`; the *_normal
// arguments are min_normal_bits of the parameter's and of the state's dtypes): each count a 0/1 int32 and each term a
// float64 (0 where it takes no part). The one element logic of both kernels: the CPU kernel keeps these in lanes of
// its own in vectorised loops (update_stats_cpu.cpp), the CUDA kernel adds them with tally_update_element.
struct UpdateElement {
  int32_t with_grad, lost, changed, weight_nonfinite, weight_subnormal, state_underflow, made_nonfinite;
  double sq_change, sq_weight;
  uint32_t magnitude;  // |after| bits where after is finite, else 0 (its amax term)
};

AMPI_HD UpdateElement judge_update_element(uint32_t before, uint32_t after, uint32_t grad, uint32_t state,
                                           bool has_state, uint32_t weight_normal, uint32_t state_normal) {
  // Non-short-circuit & and | on the tests: every test is computed, so a vectorising compiler sees no branch.
  const uint32_t abs_before = before & kAbsMask32, abs_after = after & kAbsMask32, abs_grad = grad & kAbsMask32;
  const bool finite_before = is_finite32(abs_before), finite_after = is_finite32(abs_after);
  const bool finite_grad = is_finite32(abs_grad);
  const bool with_grad = finite_grad & (abs_grad != 0u);
  // The same value: equal bits, or both zeros, and neither a NaN (the bits of finite floats and Inf are unique per
  // value; a NaN's |bits| are above Inf's)
  const bool nan = (abs_before > kInfBits32) | (abs_after > kInfBits32);
  const bool same = (!nan) & ((before == after) | ((abs_before | abs_after) == 0u));
  UpdateElement e;
  e.with_grad = with_grad;
  e.lost = with_grad & same;
  e.changed = !same;
  e.weight_nonfinite = !finite_after;
  e.weight_subnormal = (abs_after != 0u) & (abs_after < weight_normal);
  e.state_underflow = has_state & with_grad & ((state & kAbsMask32) < state_normal);
  e.made_nonfinite = finite_before & finite_grad & !finite_after;
  const double b = static_cast<double>(bits_as_float32(before)), a = static_cast<double>(bits_as_float32(after));
  const double change = a - b;
  e.sq_change = finite_before & finite_after ? change * change : 0.0;
  e.sq_weight = finite_before ? b * b : 0.0;
  e.magnitude = abs_after & (0u - static_cast<uint32_t>(finite_after));  // a mask, not a select: a plain max after
  return e;
}

// One element added to a tally: UpdateTally, or the CUDA kernel's per-thread totals (int32 counts within a chunk).
template <class Tally>
AMPI_HD void tally_update_element(Tally& t, uint32_t before, uint32_t after, uint32_t grad, uint32_t state,
                                  bool has_state, uint32_t weight_normal, uint32_t state_normal) {
  const UpdateElement e = judge_update_element(before, after, grad, state, has_state, weight_normal, state_normal);
  t.counts[kUpdWithGrad] += e.with_grad;
  t.counts[kUpdLost] += e.lost;
  t.counts[kUpdChanged] += e.changed;
  t.counts[kUpdWeightNonfinite] += e.weight_nonfinite;
  t.counts[kUpdWeightSubnormal] += e.weight_subnormal;
  t.counts[kUpdStateUnderflow] += e.state_underflow;
  t.counts[kUpdMadeNonfinite] += e.made_nonfinite;
  t.sums[kUpdSqChange] += e.sq_change;
  t.sums[kUpdSqWeight] += e.sq_weight;
  t.amax_bits = t.amax_bits > e.magnitude ? t.amax_bits : e.magnitude;
}

// ---- the CUDA kernel's launch plan ----
// What update_stats' CUDA kernel (update_stats_kernels.cuh) runs on, shared by the CUDA op, its nvcc-built launcher
// (declared here) and the emulated op.

// One nonempty tensor as the kernel reads it (update_stats_call.h's UpdateView, with its first chunk).
struct UpdateKernelView {
  const void* before;
  const void* after;
  const void* grad;
  const void* state;  // null: no exp_avg_sq
  int64_t numel;
  int64_t out_row;
  int64_t first_chunk;  // in the launch's chunks
  int32_t weight_dtype;
  int32_t grad_dtype;
  int32_t state_dtype;
  // The elements i with i % kUpdateUnitElems == vector_phase start a unit the kernel reads with 16-byte loads of
  // every input (all four arrays 16-byte aligned there); -1: no such phase (arrays misaligned apart), scalar loads
  // only. Set by the launch sequence (update_vector_phase).
  int32_t vector_phase;
};

// Elements per thread per iteration of the CUDA kernel's vector loop: one 16-byte load of each 16-bit input, two of
// each float32 one.
constexpr int kUpdateUnitElems = 8;

// The view's vector_phase (above), from its arrays' addresses: host code.
inline int32_t update_vector_phase(const UpdateKernelView& v) {
  const auto aligned = [](const void* data, int32_t dtype, int32_t phase) {
    const uintptr_t bytes = static_cast<uintptr_t>(phase) * (dtype == kFloat32 ? 4u : 2u);
    return (reinterpret_cast<uintptr_t>(data) + bytes) % 16u == 0u;
  };
  for (int32_t phase = 0; phase < kUpdateUnitElems; ++phase) {
    if (aligned(v.before, v.weight_dtype, phase) && aligned(v.after, v.weight_dtype, phase) &&
        aligned(v.grad, v.grad_dtype, phase) && (v.state == nullptr || aligned(v.state, v.state_dtype, phase))) {
      return phase;
    }
  }
  return -1;
}

constexpr int64_t kUpdateChunkElems = int64_t{1} << 16;  // the GPU's chunk: one block's work at a time
constexpr int kUpdateViewsPerLaunch = 24;  // 24 x 72 bytes of views: well inside the 4 KiB of kernel parameters

// The torch-free plan the host hands run_update_stats: all views, the outputs (device pointers), the chunk size.
struct UpdateLaunchPlan {
  const UpdateKernelView* views = nullptr;  // host memory; copied into the launches' parameters
  int64_t num_views = 0;
  int64_t num_tensors = 0;
  int64_t chunk_elems = 0;
  int64_t* counts = nullptr;  // [num_tensors, kUpdateCountColumns]
  double* sums = nullptr;     // [num_tensors, kUpdateSumColumns]
  float* amax = nullptr;      // [num_tensors]
};

// The GPU build of the kernel (update_stats_cuda.cu, by nvcc), which the CUDA op calls: zeroes the outputs and
// launches the kernel on `stream` (the device's current stream as the C shim hands it, a cudaStream_t; one launch per
// kUpdateViewsPerLaunch tensors). Asynchronous: no host sync.
void launch_update_stats(const UpdateLaunchPlan& plan, int device_index, void* stream);

}  // namespace amp_inspect
