// tensor_stats.cpp: the schema of amp_inspect::tensor_stats (defined once, here), the build_info op and the
// Python module of amp_inspect._C. Always built. Stable ABI and Python's limited API only.
#include <Python.h>
#include <torch/csrc/stable/library.h>

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
  m.def("build_info() -> str");
  // The tests' emulated CUDA ops are defined by the test-only library amp_inspect._C_emu (tensor_stats_emu.cpp).
}

// An op without tensor arguments is served by the CompositeExplicitAutograd kernel.
STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CompositeExplicitAutograd, m) {
  m.impl("build_info", TORCH_BOX(&amp_inspect::build_info));
}

// `import amp_inspect._C` loads this library, which runs the registrations above; the module itself is empty.
// Python's limited API only (Py_LIMITED_API, set by setup.py): one binary for CPython 3.10 and later.
PyMODINIT_FUNC PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module);
}
