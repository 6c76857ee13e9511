// tensor_stats_call.h: the host side shared by the CPU and CUDA backends of amp_inspect::tensor_stats.
//
// tensor_stats_call.cpp checks the inputs and turns them into a torch-free StatsCall (plain pointers, sizes,
// strides, format bounds); each backend walks the call's flat list of work chunks and fills the outputs. Stable
// ABI only; what every op shares on the host is common/op.h.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/op.h"
#include "tensor_stats/tensor_stats.h"
#include "tensor_stats/tensor_stats_launch.h"

namespace amp_inspect {

// How the op's error sentences begin (both ops: unscale_stats_ checks its own arguments in its own name).
constexpr const char* kStatsOp = "amp_inspect.tensor_stats: ";

// Outputs of one call, T = number of tensors, F = number of formats:
//   counts       int64   [T, 5 + 3F]  numel, nan, posinf, neginf, zero, overflow[F], subnormal[F], underflow[F]
//   hist         int64   [T, 256]     elements per float32 exponent field
//   amax         float32 [T]          max |v| over finite v (0 when none)
//   amin_nonzero float32 [T]          min |v| over finite nonzero v (+inf when none)
//   sumsq        float64 [T]          sum of v*v over finite v
struct StatsOutputs {
  Tensor counts;
  Tensor hist;
  Tensor amax;
  Tensor amin_nonzero;
  Tensor sumsq;

  // As the ops return them, in the order above.
  std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> returned() const { return {counts, hist, amax, amin_nonzero, sumsq}; }
};

// The outputs above as a table, in the op's order: allocation loops over it, and amp_inspect._C.layout() hands it
// to Python, whose schema of statistics (amp_inspect/core/statistics.py OUTPUTS) tests/test_schema.py holds equal to it.
enum class OutputColumns : int32_t { kNone, kCounts, kHistBins };  // [T], [T, count_columns(F)], [T, kHistBins]
struct OutputSpec {
  const char* name;
  ScalarType dtype;
  Tensor StatsOutputs::*member;
  OutputColumns columns;
  double neutral;  // the value of a tensor without elements: the identity of the statistic's merge
};
constexpr int kNumOutputs = 5;
extern const OutputSpec kOutputs[kNumOutputs];
int64_t output_columns(OutputColumns columns, int num_formats);

struct StatsCall {
  std::vector<TensorView> views;  // nonempty tensors only, in caller order
  std::vector<Tensor> keep_alive;  // contiguous copies made for tensors of more than kMaxDims strided dims
  int64_t num_tensors = 0;        // T, empty tensors included
  int64_t total_chunks = 0;
  int64_t chunk_elems = 0;
  FormatBounds bounds[kMaxFormats];
  int num_formats = 0;
  // v = x when !has_scale; else v = float32(x) * scale, with the scale read from scale_ptr when it is set
  // (a 0-dim float32 tensor on the inputs' device) and from scale_value otherwise.
  bool has_scale = false;
  float scale_value = 1.0f;
  const float* scale_ptr = nullptr;
  // unscale_stats_ only: after counting, each element is overwritten with x * inv_scale (computed in
  // float32, or float64 for float64 tensors, and rounded to the tensor's dtype), and *found_inf is set to
  // 1.0 when any element was NaN or Inf: what torch._amp_foreach_non_finite_check_and_unscale_ does.
  bool unscale = false;
  float inv_scale_value = 1.0f;         // CPU: the value; CUDA: unused
  const float* inv_scale_ptr = nullptr;  // CUDA: read on the device
  float* found_inf_ptr = nullptr;
};

// The unscale_stats_ arguments, checked and described into `call` (which prepare_call made).
void prepare_unscale(StatsCall& call, const std::vector<Tensor>& tensors, const Tensor& inv_scale,
                     const Tensor& found_inf);

// Checks the op's arguments (every message names the offending tensor's position) and describes them for
// a backend whose work chunks hold `chunk_elems` elements.
StatsCall prepare_call(const std::vector<Tensor>& tensors, const std::optional<Tensor>& scale,
                       std::optional<double> scale_value, const std::vector<std::string>& formats,
                       int64_t chunk_elems);

// The outputs on `device`: zeroed (amin_nonzero +inf), ready for kernels that accumulate into them, or left
// uninitialised for kernels that write every element.
StatsOutputs allocate_outputs(int64_t num_tensors, int num_formats, const Device& device,
                              OutputFill fill = OutputFill::kZeroed);

// What the CUDA kernels (on a GPU, or emulated on the CPU) need for `call`: outputs left uninitialised (the
// finalize kernel writes every element), a workspace the launch sequence zeroes, and the plan tying them
// together. plan.device_views is left null (views passed inline); the caller may point it at a table.
struct StatsKernelCall {
  StatsOutputs out;
  Tensor workspace;
  LaunchPlan plan;
};
StatsKernelCall prepare_kernel_call(const StatsCall& call, const Device& device);

}  // namespace amp_inspect
