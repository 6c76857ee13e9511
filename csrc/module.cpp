// module.cpp (formerly tensor_stats.cpp): the schemas of the amp_inspect ops (defined once, here), the build_info op and the
// Python module of amp_inspect._C with its one function, layout(). Always built. Stable ABI and Python's limited
// API only.
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include <initializer_list>
#include <sstream>
#include <string>

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
  m.def("format_readiness(Tensor[] tensors, int[] recipes, Tensor? tensor_amax) -> (Tensor counts, Tensor sums, Tensor amax)");
  // What optimizer.step() did to each parameter (issue 22): lost updates, state underflow (update_stats_call.h).
  m.def(
      "update_stats(Tensor[] before, Tensor[] after, Tensor[] grads, Tensor[] exp_avg_sq) -> "
      "(Tensor counts, Tensor sums, Tensor amax)");
  m.def("build_info() -> str");
  // The tests' emulated CUDA ops are defined by the test-only library amp_inspect._C_emu (tensor_stats_emu.cpp).
}

// An op without tensor arguments is served by the CompositeExplicitAutograd kernel.
STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CompositeExplicitAutograd, m) {
  m.impl("build_info", TORCH_BOX(&amp_inspect::build_info));
}

namespace {

// Moves `value` into dict[key] (the reference is consumed either way); false, with a Python error set, when
// `value` is null or the dict refuses it.
bool put(PyObject* dict, const char* key, PyObject* value) {
  if (value == nullptr) return false;
  const int status = PyDict_SetItemString(dict, key, value);
  Py_DECREF(value);
  return status == 0;
}

PyObject* tuple_of(std::initializer_list<PyObject*> items) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  Py_ssize_t i = 0;
  for (PyObject* item : items) {
    if (tuple == nullptr || item == nullptr) {
      Py_XDECREF(item);
      continue;
    }
    PyTuple_SetItem(tuple, i++, item);  // steals
  }
  if (tuple != nullptr && i != static_cast<Py_ssize_t>(items.size())) {
    Py_DECREF(tuple);
    return nullptr;
  }
  return tuple;
}

const char* dtype_name(amp_inspect::ScalarType dtype) {
  switch (dtype) {
    case amp_inspect::ScalarType::Long:
      return "int64";
    case amp_inspect::ScalarType::Float:
      return "float32";
    case amp_inspect::ScalarType::Double:
      return "float64";
    default:
      return "?";
  }
}

const char* columns_name(amp_inspect::OutputColumns columns) {
  switch (columns) {
    case amp_inspect::OutputColumns::kCounts:
      return "counts";
    case amp_inspect::OutputColumns::kHistBins:
      return "hist_bins";
    case amp_inspect::OutputColumns::kNone:
      break;
  }
  return "none";
}

PyObject* readiness_layout();  // below
PyObject* update_layout();     // below

// amp_inspect._C.layout(): the tables this binary was compiled with, for Python to check its schema of statistics
// against (amp_inspect/core/statistics.py `layout_problem`): the format names and bounds as bit patterns (tensor_stats.h
// kFormatBounds), the count columns (kFixedCountColumns, and per format), the histogram bins and the outputs.
PyObject* layout(PyObject*, PyObject*) {
  using namespace amp_inspect;
  PyObject* result = PyDict_New();
  if (result == nullptr) return nullptr;
  PyObject* names = PyTuple_New(kNumFormats);
  PyObject* bounds = PyTuple_New(kNumFormats);
  PyObject* outputs = PyTuple_New(kNumOutputs);
  bool ok = names != nullptr && bounds != nullptr && outputs != nullptr;
  for (int f = 0; ok && f < kNumFormats; ++f) {
    const FormatBounds& b = kFormatBounds[f];
    PyObject* name = PyUnicode_FromString(kFormatNames[f]);
    PyObject* row = tuple_of({PyLong_FromUnsignedLong(b.overflow_from), PyLong_FromUnsignedLong(b.normal_from),
                              PyLong_FromUnsignedLong(b.zero_upto), PyLong_FromUnsignedLongLong(b.overflow_from64),
                              PyLong_FromUnsignedLongLong(b.normal_from64), PyLong_FromUnsignedLongLong(b.zero_upto64)});
    ok = name != nullptr && row != nullptr;
    if (ok) {
      PyTuple_SetItem(names, f, name);
      PyTuple_SetItem(bounds, f, row);
    } else {
      Py_XDECREF(name);
      Py_XDECREF(row);
    }
  }
  for (int k = 0; ok && k < kNumOutputs; ++k) {
    const OutputSpec& spec = kOutputs[k];
    PyObject* row = tuple_of({PyUnicode_FromString(spec.name), PyUnicode_FromString(dtype_name(spec.dtype)),
                              PyUnicode_FromString(columns_name(spec.columns)), PyFloat_FromDouble(spec.neutral)});
    ok = row != nullptr;
    if (ok) PyTuple_SetItem(outputs, k, row);
  }
  if (!ok) {  // a Python error is set; tuples with empty slots are released like full ones
    Py_XDECREF(names);
    Py_XDECREF(bounds);
    Py_XDECREF(outputs);
    Py_DECREF(result);
    return nullptr;
  }
  // Each put() consumes its value, whether it succeeds or not.
  const bool stored_formats = put(result, "formats", names);
  const bool stored_bounds = put(result, "format_bounds", bounds);
  const bool stored_outputs = put(result, "outputs", outputs);
  ok = stored_formats && stored_bounds && stored_outputs &&
       put(result, "max_formats", PyLong_FromLong(kMaxFormats)) && put(result, "hist_bins", PyLong_FromLong(kHistBins)) &&
       put(result, "fixed_count_columns", PyLong_FromLong(kFixedCountColumns)) &&
       put(result, "count_columns_per_format", PyLong_FromLong(count_columns(1) - kFixedCountColumns)) &&
       put(result, "readiness", readiness_layout()) && put(result, "update", update_layout());
  if (!ok) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

// layout()["readiness"]: format readiness's tables (readiness.h), for statistics.readiness_layout_problem: the
// recipes (name, element format, block, scale rule), the element formats (name, mbits, emin, emax, max as float32
// bits), the scale rules, E8M0's exponent range and NVFP4's tensor divisor, the op's columns (counts fixed and per
// recipe, sums fixed and per recipe) and outputs. Null with a Python error set when an allocation fails.
PyObject* readiness_layout() {
  using namespace amp_inspect;
  PyObject* recipes = PyTuple_New(kNumRecipes);
  PyObject* elements = PyTuple_New(kNumElementFormats);
  PyObject* rules = PyTuple_New(kNumScaleRules);
  bool ok = recipes != nullptr && elements != nullptr && rules != nullptr;
  for (int r = 0; ok && r < kNumRecipes; ++r) {
    const RecipeSpec& spec = kRecipes[r];
    PyObject* row = tuple_of({PyUnicode_FromString(spec.name), PyUnicode_FromString(kElementNames[spec.element]),
                              PyLong_FromLong(spec.block), PyUnicode_FromString(kScaleRuleNames[spec.scale])});
    ok = row != nullptr;
    if (ok) PyTuple_SetItem(recipes, r, row);
  }
  for (int e = 0; ok && e < kNumElementFormats; ++e) {
    const ElementGrid& g = kElementGrids[e];
    PyObject* row = tuple_of({PyUnicode_FromString(kElementNames[e]), PyLong_FromLong(g.mbits), PyLong_FromLong(g.emin),
                              PyLong_FromLong(g.emax), PyLong_FromUnsignedLong(g.max_bits)});
    ok = row != nullptr;
    if (ok) PyTuple_SetItem(elements, e, row);
  }
  for (int k = 0; ok && k < kNumScaleRules; ++k) {
    PyObject* name = PyUnicode_FromString(kScaleRuleNames[k]);
    ok = name != nullptr;
    if (ok) PyTuple_SetItem(rules, k, name);
  }
  PyObject* result = ok ? PyDict_New() : nullptr;
  if (result == nullptr) {
    Py_XDECREF(recipes);
    Py_XDECREF(elements);
    Py_XDECREF(rules);
    return nullptr;
  }
  const bool stored = put(result, "recipes", recipes) & put(result, "element_formats", elements) &
                      put(result, "scale_rules", rules);
  ok = stored &&
       put(result, "e8m0_exponents", tuple_of({PyLong_FromLong(kE8M0MinExponent), PyLong_FromLong(kE8M0MaxExponent)})) &&
       put(result, "nvfp4_tensor_divisor", PyFloat_FromDouble(kNvfp4TensorDivisor)) &&
       put(result, "columns", tuple_of({PyLong_FromLong(kReadinessFixedCounts), PyLong_FromLong(kReadinessCountsPerRecipe),
                                        PyLong_FromLong(kReadinessFixedSums), PyLong_FromLong(kReadinessSumsPerRecipe)})) &&
       put(result, "outputs",
           tuple_of({tuple_of({PyUnicode_FromString("counts"), PyUnicode_FromString("int64")}),
                     tuple_of({PyUnicode_FromString("sums"), PyUnicode_FromString("float64")}),
                     tuple_of({PyUnicode_FromString("amax"), PyUnicode_FromString("float32")})}));
  if (!ok) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

// layout()["update"]: update_stats's columns (update_stats.h), for statistics.update_layout_problem: the names of
// the counts' and the sums' columns in order, and the outputs. Null with a Python error set when an allocation fails.
PyObject* update_layout() {
  using namespace amp_inspect;
  PyObject* counts = PyTuple_New(kUpdateCountColumns);
  PyObject* sums = PyTuple_New(kUpdateSumColumns);
  bool ok = counts != nullptr && sums != nullptr;
  for (int k = 0; ok && k < kUpdateCountColumns; ++k) {
    PyObject* name = PyUnicode_FromString(kUpdateCountNames[k]);
    ok = name != nullptr;
    if (ok) PyTuple_SetItem(counts, k, name);
  }
  for (int k = 0; ok && k < kUpdateSumColumns; ++k) {
    PyObject* name = PyUnicode_FromString(kUpdateSumNames[k]);
    ok = name != nullptr;
    if (ok) PyTuple_SetItem(sums, k, name);
  }
  PyObject* result = ok ? PyDict_New() : nullptr;
  if (result == nullptr) {
    Py_XDECREF(counts);
    Py_XDECREF(sums);
    return nullptr;
  }
  const bool stored = put(result, "counts", counts) & put(result, "sums", sums);
  ok = stored && put(result, "outputs",
                     tuple_of({tuple_of({PyUnicode_FromString("counts"), PyUnicode_FromString("int64")}),
                               tuple_of({PyUnicode_FromString("sums"), PyUnicode_FromString("float64")}),
                               tuple_of({PyUnicode_FromString("amax"), PyUnicode_FromString("float32")})}));
  if (!ok) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

PyMethodDef kMethods[] = {
    {"layout", layout, METH_NOARGS, "The format table, count columns, histogram bins, outputs and readiness recipes compiled in."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// `import amp_inspect._C` loads this library, which runs the registrations above; the module holds layout().
// Python's limited API only (Py_LIMITED_API, set by setup.py): one binary for CPython 3.10 and later.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kMethods, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
