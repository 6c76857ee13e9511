// tensor_stats.cpp: the schema of amp_inspect::tensor_stats (defined once, here), the build_info op and the
// Python module of amp_inspect._C with its one function, layout(). Always built. Stable ABI and Python's limited
// API only.
#include <Python.h>
#include <torch/csrc/stable/library.h>

#include <initializer_list>
#include <sstream>
#include <string>

#include "tensor_stats.h"

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

// amp_inspect._C.layout(): the tables this binary was compiled with, for Python to check its schema of statistics
// against (amp_inspect/statistics.py `layout_problem`): the format names and bounds as bit patterns (numerics.h
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
       put(result, "count_columns_per_format", PyLong_FromLong(count_columns(1) - kFixedCountColumns));
  if (!ok) {
    Py_DECREF(result);
    return nullptr;
  }
  return result;
}

PyMethodDef kMethods[] = {
    {"layout", layout, METH_NOARGS, "The format table, count columns, histogram bins and outputs compiled in."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// `import amp_inspect._C` loads this library, which runs the registrations above; the module holds layout().
// Python's limited API only (Py_LIMITED_API, set by setup.py): one binary for CPython 3.10 and later.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, kMethods, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
