// tensor_stats_call.h: the host side shared by the CPU and CUDA backends of amp_inspect::tensor_stats and
// unscale_stats_: the input checks, which describe the inputs as a torch-free StatsCall (plain pointers, sizes,
// strides, format bounds) whose flat list of work chunks each backend walks; the outputs; and the plan the CUDA
// kernels run on. Stable ABI only; what every op shares on the host is common/op.h.
//
// Header-only (inline): each library compiles its own copy, in the one file of it that runs the op (the CPU kernel
// in _C, the CUDA op in _C_cuda, the emulated op in the test-only _C_emu).
#pragma once

#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/op.h"
#include "tensor_stats/tensor_stats.h"

namespace amp_inspect {

// How the op's error sentences begin (unscale_stats_'s too, but for the checks of its own arguments, which name it).
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
  std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> returned() const {
    return {counts, hist, amax, amin_nonzero, sumsq};
  }
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
inline constexpr OutputSpec kOutputs[kNumOutputs] = {
    {"counts", ScalarType::Long, &StatsOutputs::counts, OutputColumns::kCounts, 0.0},
    {"hist", ScalarType::Long, &StatsOutputs::hist, OutputColumns::kHistBins, 0.0},
    {"amax", ScalarType::Float, &StatsOutputs::amax, OutputColumns::kNone, 0.0},
    {"amin_nonzero", ScalarType::Float, &StatsOutputs::amin_nonzero, OutputColumns::kNone, INFINITY},
    {"sumsq", ScalarType::Double, &StatsOutputs::sumsq, OutputColumns::kNone, 0.0},
};
inline int64_t output_columns(OutputColumns columns, int num_formats);

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
inline void prepare_unscale(StatsCall& call, const std::vector<Tensor>& tensors, const Tensor& inv_scale,
                            const Tensor& found_inf);

// Checks the op's arguments (every message names the offending tensor's position) and describes them for
// a backend whose work chunks hold `chunk_elems` elements.
inline StatsCall prepare_call(const std::vector<Tensor>& tensors, const std::optional<Tensor>& scale,
                              std::optional<double> scale_value, const std::vector<std::string>& formats,
                              int64_t chunk_elems);

// The outputs on `device`: zeroed (amin_nonzero +inf), ready for kernels that accumulate into them, or left
// uninitialised for kernels that write every element.
inline StatsOutputs allocate_outputs(int64_t num_tensors, int num_formats, const Device& device,
                                     OutputFill fill = OutputFill::kZeroed);

// What the CUDA kernels (on a GPU, or emulated on the CPU) need for `call`: outputs left uninitialised (the
// finalize kernel writes every element), a workspace the launch sequence zeroes, and the plan tying them
// together. plan.device_views is left null (views passed inline); the caller may point it at a table.
struct StatsKernelCall {
  StatsOutputs out;
  Tensor workspace;
  LaunchPlan plan;
};
inline StatsKernelCall prepare_kernel_call(const StatsCall& call, const Device& device);

// ---- definitions ----

inline int64_t output_columns(OutputColumns columns, int num_formats) {
  switch (columns) {
    case OutputColumns::kCounts:
      return count_columns(num_formats);
    case OutputColumns::kHistBins:
      return kHistBins;
    case OutputColumns::kNone:
      break;
  }
  return 0;
}

// The checks' helpers.
namespace stats_call_detail {

inline int format_id(const std::string& name) {
  std::string known;
  for (int f = 0; f < kNumFormats; ++f) {
    if (name == kFormatNames[f]) return f;
    known += (f ? ", " : "") + std::string(kFormatNames[f]);
  }
  fail(kStatsOp, "unknown format '", name, "'; expected one of ", known);
}

inline InputDtype input_dtype(const Tensor& t, size_t position) {
  const std::optional<InputDtype> dtype = input_dtype_of(t.scalar_type(), /*float64_too=*/true);
  AMPI_CHECK(dtype.has_value(), kStatsOp, "tensor ", position, " has dtype ", t.scalar_type(),
             "; expected float32, float16, bfloat16 or float64");
  return *dtype;
}

// at::Tensor::is_non_overlapping_and_dense, computed by hand (the stable ABI has no call for it): the dims,
// sorted by stride, tile the storage span exactly.
inline bool non_overlapping_and_dense(const Tensor& t) {
  const int64_t ndim = t.dim();
  std::vector<int64_t> order;
  for (int64_t d = 0; d < ndim; ++d) {
    if (t.size(d) == 0) return true;
    if (t.size(d) != 1) order.push_back(d);
  }
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) < t.stride(b); });
  int64_t expected = 1;
  for (const int64_t d : order) {
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

// at::has_internal_overlap's "Yes" (the only answer it is sure of): a dim of more than one element with
// stride 0, as expand() makes.
inline bool surely_overlapping(const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) == 0) return true;
  }
  return false;
}

inline float read_cpu_float(const Tensor& t) {
  float v;
  std::memcpy(&v, t.data_ptr(), sizeof v);
  return v;
}

// Describes a strided tensor with its dims collapsed: size-1 dims dropped, neighbours merged where they
// are laid out as one. Returns false when more than kMaxDims dims remain.
inline bool describe_strided(const Tensor& t, TensorView& view) {
  int64_t sizes[64];
  int64_t strides[64];
  int ndim = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t size = t.size(d);
    const int64_t stride = t.stride(d);
    if (size == 1) continue;
    if (ndim > 0 && strides[ndim - 1] == stride * size) {
      sizes[ndim - 1] *= size;
      strides[ndim - 1] = stride;
      continue;
    }
    if (ndim == 64) return false;
    sizes[ndim] = size;
    strides[ndim] = stride;
    ++ndim;
  }
  if (ndim > kMaxDims) return false;
  if (ndim == 0) {  // a single element
    sizes[0] = 1;
    strides[0] = 1;
    ndim = 1;
  }
  view.ndim = ndim;
  for (int d = 0; d < ndim; ++d) {
    view.sizes[d] = sizes[d];
    view.strides[d] = strides[d];
  }
  return true;
}

}  // namespace stats_call_detail

inline StatsCall prepare_call(const std::vector<Tensor>& tensors, const std::optional<Tensor>& scale,
                              std::optional<double> scale_value, const std::vector<std::string>& formats,
                              int64_t chunk_elems) {
  using namespace stats_call_detail;
  StatsCall call;
  call.num_tensors = static_cast<int64_t>(tensors.size());
  call.chunk_elems = chunk_elems;

  AMPI_CHECK(!formats.empty(), kStatsOp, "formats must name at least one format");
  AMPI_CHECK(formats.size() <= static_cast<size_t>(kMaxFormats), kStatsOp, "at most ", kMaxFormats,
             " formats, got ", formats.size());
  bool seen[kNumFormats] = {false, false, false, false};
  for (const auto& name : formats) {
    const int id = format_id(name);
    AMPI_CHECK(!seen[id], kStatsOp, "format '", name, "' is listed twice");
    seen[id] = true;
    call.bounds[call.num_formats++] = kFormatBounds[id];
  }

  std::optional<Device> device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    AMPI_CHECK(t.defined(), kStatsOp, "tensor ", i, " is undefined (None)");
    AMPI_CHECK(is_strided(t, kStatsOp), kStatsOp, "tensor ", i,
               " is not a dense (strided) tensor; only dense tensors are supported");
    input_dtype(t, i);
    if (!device) device = t.device();
    AMPI_CHECK(same_device(t.device(), *device), kStatsOp, "tensor ", i, " is on ",
               device_name(t.device()), " but tensor 0 is on ", device_name(*device),
               "; the op takes one device per call (the Python entry point amp_inspect.tensor_stats groups mixed "
               "lists by device)");
  }

  AMPI_CHECK(!(scale.has_value() && scale_value.has_value()),
             kStatsOp, "pass the scale as a tensor or as a number, not both");
  if (scale_value.has_value()) {
    const double s = *scale_value;
    AMPI_CHECK(std::isfinite(s) && s > 0, kStatsOp, "scale must be finite and positive, got ", s);
    const float s32 = static_cast<float>(s);
    AMPI_CHECK(std::isfinite(s32) && s32 > 0, kStatsOp, "scale ", s,
               " is not a finite positive float32");
    call.has_scale = true;
    call.scale_value = s32;
  }
  if (scale.has_value()) {
    const Tensor& s = *scale;
    AMPI_CHECK(s.scalar_type() == ScalarType::Float && s.numel() == 1,
               kStatsOp, "a scale tensor must be a float32 tensor of one element, got dtype ",
               s.scalar_type(), " and ", s.numel(), " elements");
    if (device) {
      AMPI_CHECK(same_device(s.device(), *device), kStatsOp, "the scale tensor is on ",
                 device_name(s.device()), " but the tensors are on ", device_name(*device));
    }
    if (s.is_cpu()) {  // reading it costs no sync here, so check it like a number
      const float v = read_cpu_float(s);
      AMPI_CHECK(std::isfinite(v) && v > 0, kStatsOp, "scale must be finite and positive, got ", v);
    }
    call.has_scale = true;
    call.scale_ptr = static_cast<const float*>(s.data_ptr());
  }

  int64_t next_chunk = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    const int64_t numel = t.numel();
    if (numel == 0) continue;
    TensorView view{};
    view.numel = numel;
    view.out_row = static_cast<int64_t>(i);
    view.dtype = input_dtype(t, i);
    if (non_overlapping_and_dense(t)) {
      // Statistics do not depend on element order, so any dense layout is read as its storage span, which
      // starts at the element of smallest offset: data_ptr() plus the negative strides' reach (none here:
      // torch tensors have no negative strides).
      view.data = t.data_ptr();
      view.ndim = 1;
      view.sizes[0] = numel;
      view.strides[0] = 1;
    } else if (describe_strided(t, view)) {
      view.data = t.data_ptr();
    } else {
      // More strided dims than a view holds: read a contiguous copy (rare; the only temporary the op makes).
      Tensor copy = torch::stable::contiguous(t);
      call.keep_alive.push_back(copy);
      view.data = copy.data_ptr();
      view.ndim = 1;
      view.sizes[0] = numel;
      view.strides[0] = 1;
    }
    view.first_chunk = next_chunk;
    next_chunk += (numel + chunk_elems - 1) / chunk_elems;
    call.views.push_back(view);
  }
  call.total_chunks = next_chunk;
  return call;
}

inline void prepare_unscale(StatsCall& call, const std::vector<Tensor>& tensors, const Tensor& inv_scale,
                            const Tensor& found_inf) {
  using namespace stats_call_detail;
  AMPI_CHECK(!call.has_scale, "amp_inspect.unscale_stats_: takes no scale");
  for (const Tensor* t : {&inv_scale, &found_inf}) {
    AMPI_CHECK(t->scalar_type() == ScalarType::Float && t->numel() == 1,
               "amp_inspect.unscale_stats_: inv_scale and found_inf must be float32 tensors of one element");
    if (!tensors.empty()) {
      AMPI_CHECK(same_device(t->device(), tensors[0].device()),
                 "amp_inspect.unscale_stats_: inv_scale and found_inf must be on ", device_name(tensors[0].device()),
                 ", got ", device_name(t->device()));
    }
  }
  AMPI_CHECK(call.keep_alive.empty(), "amp_inspect.unscale_stats_: a tensor has more than ", kMaxDims,
             " strided dims after collapsing; it cannot be unscaled in place (make it contiguous)");
  for (size_t i = 0; i < tensors.size(); ++i) {
    AMPI_CHECK(tensors[i].numel() <= 1 || non_overlapping_and_dense(tensors[i]) || !surely_overlapping(tensors[i]),
               "amp_inspect.unscale_stats_: tensor ", i,
               " has overlapping elements (e.g. expanded); it cannot be unscaled in place");
  }
  call.unscale = true;
  call.inv_scale_ptr = static_cast<const float*>(inv_scale.data_ptr());
  call.found_inf_ptr = static_cast<float*>(found_inf.data_ptr());
  if (inv_scale.is_cpu()) call.inv_scale_value = read_cpu_float(inv_scale);
}

inline StatsOutputs allocate_outputs(int64_t num_tensors, int num_formats, const Device& device, OutputFill fill) {
  StatsOutputs out;
  for (const OutputSpec& spec : kOutputs) {
    std::vector<int64_t> shape{num_tensors};
    if (spec.columns != OutputColumns::kNone) shape.push_back(output_columns(spec.columns, num_formats));
    out.*spec.member = allocate_output(shape, spec.dtype, device, fill, spec.neutral, "amp_inspect: ");
  }
  return out;
}

inline StatsKernelCall prepare_kernel_call(const StatsCall& call, const Device& device) {
  StatsKernelCall k;
  k.out = allocate_outputs(call.num_tensors, call.num_formats, device, OutputFill::kUninitialised);
  k.workspace = empty_tensor({call.num_tensors, workspace_columns(call.num_formats)}, ScalarType::Long, device);

  LaunchPlan& p = k.plan;
  p = LaunchPlan{};
  p.host_views = call.views.data();
  p.num_views = static_cast<int64_t>(call.views.size());
  p.device_views = nullptr;
  p.num_tensors = call.num_tensors;
  p.total_chunks = call.total_chunks;
  p.chunk_elems = call.chunk_elems;
  for (int f = 0; f < call.num_formats; ++f) p.bounds[f] = call.bounds[f];
  p.num_formats = call.num_formats;
  p.mode = call.unscale ? kLaunchUnscale : (call.has_scale ? kLaunchScaled : kLaunchPlain);
  p.scale_value = call.scale_value;
  p.scale_ptr = call.scale_ptr;
  p.inv_scale = call.unscale ? call.inv_scale_ptr : nullptr;
  p.found_inf = call.unscale ? call.found_inf_ptr : nullptr;
  p.workspace = static_cast<int64_t*>(k.workspace.data_ptr());
  p.workspace_words = k.workspace.numel();
  p.counts = static_cast<int64_t*>(k.out.counts.data_ptr());
  p.hist = static_cast<int64_t*>(k.out.hist.data_ptr());
  p.amax = static_cast<float*>(k.out.amax.data_ptr());
  p.amin_nonzero = static_cast<float*>(k.out.amin_nonzero.data_ptr());
  p.sumsq = static_cast<double*>(k.out.sumsq.data_ptr());
  return k;
}

}  // namespace amp_inspect
