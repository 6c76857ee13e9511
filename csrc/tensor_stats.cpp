// tensor_stats.cpp: the schema of amp_inspect::tensor_stats (defined once, here), input checks, the
// torch-free call description the backends run on, and the build_info op. Always built.
#include "tensor_stats.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <Python.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace amp_inspect {
namespace {

// Names in FormatId order; amp_inspect/formats.py keeps the same list.
const char* const kFormatNames[kNumFormats] = {"fp16", "bf16", "fp8_e4m3", "fp8_e5m2"};

int format_id(const std::string& name) {
  for (int f = 0; f < kNumFormats; ++f) {
    if (name == kFormatNames[f]) return f;
  }
  TORCH_CHECK(false, "amp_inspect.tensor_stats: unknown format '", name,
              "'; expected one of fp16, bf16, fp8_e4m3, fp8_e5m2");
}

InputDtype input_dtype(const at::Tensor& t, size_t position) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return kFloat32;
    case at::kHalf:
      return kFloat16;
    case at::kBFloat16:
      return kBFloat16;
    case at::kDouble:
      return kFloat64;
    default:
      TORCH_CHECK(false, "amp_inspect.tensor_stats: tensor ", position, " has dtype ", t.scalar_type(),
                  "; expected float32, float16, bfloat16 or float64");
  }
}

// Describes a strided tensor with its dims collapsed: size-1 dims dropped, neighbours merged where they
// are laid out as one. Returns false when more than kMaxDims dims remain.
bool describe_strided(const at::Tensor& t, TensorView& view) {
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

}  // namespace

StatsCall prepare_call(const std::vector<at::Tensor>& tensors, const std::optional<at::Tensor>& scale,
                       std::optional<double> scale_value, const std::vector<std::string>& formats,
                       int64_t chunk_elems) {
  StatsCall call;
  call.num_tensors = static_cast<int64_t>(tensors.size());
  call.chunk_elems = chunk_elems;

  TORCH_CHECK(!formats.empty(), "amp_inspect.tensor_stats: formats must name at least one format");
  TORCH_CHECK(formats.size() <= static_cast<size_t>(kMaxFormats),
              "amp_inspect.tensor_stats: at most ", kMaxFormats, " formats, got ", formats.size());
  bool seen[kNumFormats] = {false, false, false, false};
  for (const auto& name : formats) {
    const int id = format_id(name);
    TORCH_CHECK(!seen[id], "amp_inspect.tensor_stats: format '", name, "' is listed twice");
    seen[id] = true;
    call.bounds[call.num_formats++] = kFormatBounds[id];
  }

  std::optional<at::Device> device;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    TORCH_CHECK(t.defined(), "amp_inspect.tensor_stats: tensor ", i, " is undefined (None)");
    TORCH_CHECK(t.layout() == at::kStrided, "amp_inspect.tensor_stats: tensor ", i, " has layout ",
                t.layout(), "; only dense (strided) tensors are supported");
    input_dtype(t, i);
    if (!device) device = t.device();
    TORCH_CHECK(t.device() == *device, "amp_inspect.tensor_stats: tensor ", i, " is on ", t.device(),
                " but tensor 0 is on ", *device, "; the op takes one device per call (the Python entry "
                "point amp_inspect.tensor_stats groups mixed lists by device)");
  }

  TORCH_CHECK(!(scale.has_value() && scale_value.has_value()),
              "amp_inspect.tensor_stats: pass the scale as a tensor or as a number, not both");
  if (scale_value.has_value()) {
    const double s = *scale_value;
    TORCH_CHECK(std::isfinite(s) && s > 0, "amp_inspect.tensor_stats: scale must be finite and positive, got ",
                s);
    const float s32 = static_cast<float>(s);
    TORCH_CHECK(std::isfinite(s32) && s32 > 0, "amp_inspect.tensor_stats: scale ", s,
                " is not a finite positive float32");
    call.has_scale = true;
    call.scale_value = s32;
  }
  if (scale.has_value()) {
    const at::Tensor& s = *scale;
    TORCH_CHECK(s.scalar_type() == at::kFloat && s.numel() == 1,
                "amp_inspect.tensor_stats: a scale tensor must be a float32 tensor of one element, got dtype ",
                s.scalar_type(), " and ", s.numel(), " elements");
    if (device) {
      TORCH_CHECK(s.device() == *device, "amp_inspect.tensor_stats: the scale tensor is on ", s.device(),
                  " but the tensors are on ", *device);
    }
    if (s.device().is_cpu()) {  // reading it costs no sync here, so check it like a number
      const float v = *s.data_ptr<float>();
      TORCH_CHECK(std::isfinite(v) && v > 0, "amp_inspect.tensor_stats: scale must be finite and positive, got ",
                  v);
    }
    call.has_scale = true;
    call.scale_ptr = s.data_ptr<float>();
  }

  int64_t next_chunk = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const int64_t numel = t.numel();
    if (numel == 0) continue;
    TensorView view{};
    view.numel = numel;
    view.out_row = static_cast<int64_t>(i);
    view.dtype = input_dtype(t, i);
    if (t.is_non_overlapping_and_dense()) {
      // Statistics do not depend on element order, so any dense layout is read as its storage span.
      view.data = t.data_ptr();
      view.ndim = 1;
      view.sizes[0] = numel;
      view.strides[0] = 1;
    } else if (describe_strided(t, view)) {
      view.data = t.data_ptr();
    } else {
      // More strided dims than a view holds: read a contiguous copy (rare; the only temporary the op makes).
      at::Tensor copy = t.contiguous();
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

void prepare_unscale(StatsCall& call, const std::vector<at::Tensor>& tensors, const at::Tensor& inv_scale,
                     const at::Tensor& found_inf) {
  TORCH_CHECK(!call.has_scale, "amp_inspect.unscale_stats_: takes no scale");
  for (const at::Tensor& t : {inv_scale, found_inf}) {
    TORCH_CHECK(t.scalar_type() == at::kFloat && t.numel() == 1,
                "amp_inspect.unscale_stats_: inv_scale and found_inf must be float32 tensors of one element");
    if (!tensors.empty()) {
      TORCH_CHECK(t.device() == tensors[0].device(), "amp_inspect.unscale_stats_: inv_scale and found_inf must be on ",
                  tensors[0].device(), ", got ", t.device());
    }
  }
  TORCH_CHECK(call.keep_alive.empty(),
              "amp_inspect.unscale_stats_: a tensor has more than ", kMaxDims,
              " strided dims after collapsing; it cannot be unscaled in place (make it contiguous)");
  for (size_t i = 0; i < tensors.size(); ++i) {
    TORCH_CHECK(tensors[i].numel() <= 1 || tensors[i].is_non_overlapping_and_dense() ||
                    at::has_internal_overlap(tensors[i]) != at::MemOverlap::Yes,
                "amp_inspect.unscale_stats_: tensor ", i, " has overlapping elements (e.g. expanded); it cannot be "
                "unscaled in place");
  }
  call.unscale = true;
  call.inv_scale_ptr = inv_scale.data_ptr<float>();
  call.found_inf_ptr = found_inf.data_ptr<float>();
  if (inv_scale.device().is_cpu()) call.inv_scale_value = *call.inv_scale_ptr;
}

StatsOutputs allocate_outputs(int64_t num_tensors, int num_formats, const at::Device& device, OutputFill fill) {
  const auto on_device = at::TensorOptions().device(device);
  const bool zeroed = fill == OutputFill::kZeroed;
  const auto make = [&](at::IntArrayRef shape, at::ScalarType dtype) {
    return zeroed ? at::zeros(shape, on_device.dtype(dtype)) : at::empty(shape, on_device.dtype(dtype));
  };
  StatsOutputs out;
  out.counts = make({num_tensors, count_columns(num_formats)}, at::kLong);
  out.hist = make({num_tensors, kHistBins}, at::kLong);
  out.amax = make({num_tensors}, at::kFloat);
  out.amin_nonzero = zeroed ? at::full({num_tensors}, INFINITY, on_device.dtype(at::kFloat))
                            : at::empty({num_tensors}, on_device.dtype(at::kFloat));
  out.sumsq = make({num_tensors}, at::kDouble);
  return out;
}

KernelCall prepare_kernel_call(const StatsCall& call, const at::Device& device) {
  KernelCall k;
  k.out = allocate_outputs(call.num_tensors, call.num_formats, device, OutputFill::kUninitialised);
  k.workspace = at::empty({call.num_tensors, workspace_columns(call.num_formats)},
                          at::TensorOptions().dtype(at::kLong).device(device));

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
  p.workspace = k.workspace.data_ptr<int64_t>();
  p.workspace_words = k.workspace.numel();
  p.counts = k.out.counts.data_ptr<int64_t>();
  p.hist = k.out.hist.data_ptr<int64_t>();
  p.amax = k.out.amax.data_ptr<float>();
  p.amin_nonzero = k.out.amin_nonzero.data_ptr<float>();
  p.sumsq = k.out.sumsq.data_ptr<double>();
  return k;
}

namespace {

// What this binary was built with; amp_inspect.info prints it.
std::string build_info() {
  std::ostringstream s;
  s << "cpu=1";
#ifdef AMPI_WITH_CUDA
  s << "\ncuda=1\ncuda_archs=" << AMPI_CUDA_ARCHS;
#else
  s << "\ncuda=0";
#endif
  return s.str();
}

}  // namespace
}  // namespace amp_inspect

TORCH_LIBRARY(amp_inspect, m) {
  m.def(
      "tensor_stats(Tensor[] tensors, Tensor? scale, float? scale_value, str[] formats) -> "
      "(Tensor counts, Tensor hist, Tensor amax, Tensor amin_nonzero, Tensor sumsq)");
  // The fused unscale pass of InspectingGradScaler: statistics of the tensors as stored (scaled), then each
  // tensor multiplied in place by inv_scale, and found_inf set to 1 where any value was NaN or Inf.
  m.def(
      "unscale_stats_(Tensor(a!)[] tensors, Tensor inv_scale, Tensor(b!) found_inf, str[] formats) -> "
      "(Tensor counts, Tensor hist, Tensor amax, Tensor amin_nonzero, Tensor sumsq)");
  m.def("build_info() -> str", &amp_inspect::build_info);
  // Tests only: the CUDA kernels' source run on the CPU by tensor_stats_emu.cpp, with the chunk size and the
  // number of blocks chosen by the caller (blocks <= 0: as many as chunks, at most 4), and with the views
  // passed in the kernels' parameters (inline_views, as under CUDA graph capture) or as a table.
  m.def(
      "_tensor_stats_emulated(Tensor[] tensors, Tensor? scale, float? scale_value, str[] formats, int chunk_elems, "
      "int blocks, bool inline_views) -> (Tensor counts, Tensor hist, Tensor amax, Tensor amin_nonzero, "
      "Tensor sumsq)");
  m.def(
      "_unscale_stats_emulated_(Tensor(a!)[] tensors, Tensor inv_scale, Tensor(b!) found_inf, str[] formats, "
      "int chunk_elems, int blocks, bool inline_views) -> (Tensor counts, Tensor hist, Tensor amax, "
      "Tensor amin_nonzero, Tensor sumsq)");
}

// `import amp_inspect._C` loads this library, which runs the registrations above; the module itself is empty.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
