// module.cpp: the root of amp_inspect._C, the one file that names every op: their schemas (defined once, here),
// the build_info op, and the Python module with its one function, layout(), each op's tables as Python sees them
// (built with common/layout.h). Always built. Stable ABI and Python's limited API only.
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include <sstream>
#include <string>

#include "common/layout.h"
#include "readiness/readiness.h"
#include "tensor_stats/tensor_stats_call.h"
#include "update_stats/update_stats.h"

namespace amp_inspect {
namespace {

// What this binary was built with; amp_inspect.info prints it. The CUDA kernels live in a library of their
// own (amp_inspect/_C_cuda), loaded only beside a torch of the CUDA major they were built for (cuda_major).
std::string build_info() {
  std::ostringstream s;
  s << "cpu=1\nabi=stable\ntorch_target=2.10\nbuilt_with_torch=" << TORCH_VERSION;
#ifdef AMPI_WITH_CUDA
  s << "\ncuda=1\ncuda_archs=" << AMPI_CUDA_ARCHS << "\ncuda_major=" << AMPI_CUDA_MAJOR;
#else
  s << "\ncuda=0";
#endif
  return s.str();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY(amp_inspect, m) {
  m.def(
      "tensor_stats(Tensor[] tensors, Tensor? scale, float? scale_value, str[] formats) -> "
      "(Tensor counts, Tensor hist, Tensor amax, Tensor amin_nonzero, Tensor sumsq)");
  // The fused unscale pass of InspectingGradScaler: statistics of the tensors as stored (scaled), then each
  // tensor multiplied in place by inv_scale, and found_inf set to 1 where any value was NaN or Inf.
  m.def(
      "unscale_stats_(Tensor(a!)[] tensors, Tensor inv_scale, Tensor(b!) found_inf, str[] formats) -> "
      "(Tensor counts, Tensor hist, Tensor amax, Tensor amin_nonzero, Tensor sumsq)");
  // Format readiness (issue 21): what each low-precision GEMM recipe would lose on each tensor (readiness_call.h).
  m.def(
      "format_readiness(Tensor[] tensors, int[] recipes, Tensor? tensor_amax) -> "
      "(Tensor counts, Tensor sums, Tensor amax)");
  // What optimizer.step() did to each parameter (issue 22): lost updates, state underflow (update_stats_call.h).
  m.def(
      "update_stats(Tensor[] before, Tensor[] after, Tensor[] grads, Tensor[] exp_avg_sq) -> "
      "(Tensor counts, Tensor sums, Tensor amax)");
  m.def("build_info() -> str");
  // The tests' emulated CUDA ops are defined by the test-only library amp_inspect._C_emu (each op's *_emu.cpp).
}

// An op without tensor arguments is served by the CompositeExplicitAutograd kernel.
STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CompositeExplicitAutograd, m) {
  m.impl("build_info", TORCH_BOX(&amp_inspect::build_info));
}

namespace {

using namespace amp_inspect;
using namespace amp_inspect::layout;

const char* columns_name(OutputColumns columns) {
  switch (columns) {
    case OutputColumns::kCounts:
      return "counts";
    case OutputColumns::kHistBins:
      return "hist_bins";
    case OutputColumns::kNone:
      break;
  }
  return "none";
}

// layout()["readiness"]: format readiness's tables (readiness.h), for statistics.readiness_layout_problem: the
// recipes (name, element format, block, scale rule), the element formats (name, mbits, emin, emax, max as float32
// bits), the scale rules, E8M0's exponent range and NVFP4's tensor divisor, the op's columns (counts fixed and per
// recipe, sums fixed and per recipe) and outputs.
PyObject* readiness_layout() {
  return dict_of({
      {"recipes", tuple_of_rows(kNumRecipes,
                                [](int64_t r) {
                                  const RecipeSpec& spec = kRecipes[r];
                                  return tuple_of({text(spec.name), text(kElementNames[spec.element]),
                                                   integer(spec.block), text(kScaleRuleNames[spec.scale])});
                                })},
      {"element_formats", tuple_of_rows(kNumElementFormats,
                                        [](int64_t e) {
                                          const ElementGrid& g = kElementGrids[e];
                                          return tuple_of({text(kElementNames[e]), integer(g.mbits), integer(g.emin),
                                                           integer(g.emax), bits(g.max_bits)});
                                        })},
      {"scale_rules", names(kScaleRuleNames, kNumScaleRules)},
      {"e8m0_exponents", tuple_of({integer(kE8M0MinExponent), integer(kE8M0MaxExponent)})},
      {"nvfp4_tensor_divisor", real(kNvfp4TensorDivisor)},
      {"columns", tuple_of({integer(kReadinessFixedCounts), integer(kReadinessCountsPerRecipe),
                            integer(kReadinessFixedSums), integer(kReadinessSumsPerRecipe)})},
      {"outputs", tally_outputs()},
  });
}

// layout()["update"]: update_stats's columns (update_stats.h), for statistics.update_layout_problem: the names of
// the counts' and the sums' columns in order, and the outputs.
PyObject* update_layout() {
  return dict_of({
      {"counts", names(kUpdateCountNames, kUpdateCountColumns)},
      {"sums", names(kUpdateSumNames, kUpdateSumColumns)},
      {"outputs", tally_outputs()},
  });
}

// amp_inspect._C.layout(): the tables this binary was compiled with, for Python to check its schema of statistics
// against (amp_inspect/core/statistics.py `layout_problem`): the format names and bounds as bit patterns
// (tensor_stats.h kFormatBounds), the count columns (kFixedCountColumns, and per format), the histogram bins and the
// outputs; then each other op's tables. Null with a Python error set when an allocation fails.
PyObject* compiled_layout(PyObject*, PyObject*) {
  return dict_of({
      {"formats", names(kFormatNames, kNumFormats)},
      {"format_bounds", tuple_of_rows(kNumFormats,
                                      [](int64_t f) {
                                        const FormatBounds& b = kFormatBounds[f];
                                        return tuple_of({bits(b.overflow_from), bits(b.normal_from),
                                                         bits(b.zero_upto), bits(b.overflow_from64),
                                                         bits(b.normal_from64), bits(b.zero_upto64)});
                                      })},
      {"outputs", tuple_of_rows(kNumOutputs,
                                [](int64_t k) {
                                  const OutputSpec& spec = kOutputs[k];
                                  return tuple_of({text(spec.name), text(dtype_name(spec.dtype)),
                                                   text(columns_name(spec.columns)), real(spec.neutral)});
                                })},
      {"max_formats", integer(kMaxFormats)},
      {"hist_bins", integer(kHistBins)},
      {"fixed_count_columns", integer(kFixedCountColumns)},
      {"count_columns_per_format", integer(count_columns(1) - kFixedCountColumns)},
      {"readiness", readiness_layout()},
      {"update", update_layout()},
  });
}

PyMethodDef kMethods[] = {
    {"layout", compiled_layout, METH_NOARGS,
     "The format table, count columns, histogram bins, outputs and readiness recipes compiled in."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// `import amp_inspect._C` loads this library, which runs the registrations above; the module holds layout().
// Python's limited API only (Py_LIMITED_API, set by setup.py): one binary for CPython 3.10 and later.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kMethods, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
