"""Loads the compiled kernels, built against torch's stable ABI (one binary for every torch from 2.10 on):
``amp_inspect._C`` (the op's schema, the CPU kernels; the tests' emulated CUDA kernels are ``_C_emu``) and,
when the build holds them, the CUDA kernels, a library of their own (``amp_inspect/_C_cuda*.so``) loaded only
when this torch is a CUDA build of the CUDA major they were compiled for: a cu13 binary beside torch
2.10+cu128 still serves its CPU kernels, and says once, in one line, why its CUDA kernels are off
(``CUDA_OFF``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from amp_inspect.core.statistics import layout_problem

try:
    from amp_inspect import _C  # (loading it runs the op's registrations)

    LOAD_ERROR: str | None = None
except (ImportError, OSError) as error:  # pragma: no cover - exercised by the fallback test in a subprocess
    LOAD_ERROR = f"{type(error).__name__}: {error}"
else:
    # A binary built from other sources would put statistics in other columns than the schema says, and one built
    # before an op lacks it: neither is used (a binary serves whole or not at all; the references serve instead).
    _problem = layout_problem(_C.layout()) if hasattr(_C, "layout") else "it has no layout() (built before it)"
    if _problem is not None:
        LOAD_ERROR = f"its tables differ from this package's ({_problem}): rebuild it from these sources"


def _build_info() -> dict[str, str]:
    text = torch.ops.amp_inspect.build_info()
    return dict(item.split("=", 1) for item in text.splitlines())


def _load_cuda_kernels() -> str | None:
    """Loads the CUDA library where it can serve this torch; else the one line that says why it is off."""
    info = _build_info()
    if info.get("cuda") != "1":
        return None  # built without CUDA kernels: amp_inspect.info and the first GPU call say so
    built = info.get("cuda_major", "?")
    if torch.version.cuda is None:
        return None  # a CPU-only torch has no GPU to serve
    have = torch.version.cuda.split(".")[0]
    if have != built:
        # PyPI has NVIDIA's nvcc for CUDA 13, not for 12 (docs/install.md): a CUDA 12 torch needs a toolkit first.
        compiler = (
            "it fetches the matching nvcc if needed"
            if have != "12"
            else "with a CUDA 12 toolkit: PyPI has no nvcc for 12"
        )
        return (
            f"amp_inspect: its CUDA kernels are off: they were built for CUDA {built} and this torch "
            f"({torch.__version__}) is a CUDA {have} build; GPU tensors get the pure-torch reference. Build them for "
            f"it from a checkout with `pip install --no-build-isolation .` ({compiler})."
        )
    # Beside _C (the package's top folder), not beside this module: the two libraries are built side by side.
    libraries = sorted(Path(_C.__file__).parent.glob("_C_cuda*.so"))
    if not libraries:
        return "amp_inspect: its CUDA kernels are off: the build lists them but amp_inspect/_C_cuda*.so is missing."
    try:
        torch.ops.load_library(str(libraries[0]))
    except OSError as error:
        return f"amp_inspect: its CUDA kernels are off: {libraries[0].name} could not be loaded ({error})."
    global CUDA_LOADED
    CUDA_LOADED = True
    return None


CUDA_LOADED = False  # whether _C_cuda loaded: its CUDA kernels are registered
CUDA_OFF: str | None = None if LOAD_ERROR is not None else _load_cuda_kernels()
if CUDA_OFF is not None:
    warnings.warn(CUDA_OFF, RuntimeWarning, stacklevel=2)
