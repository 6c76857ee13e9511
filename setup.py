"""Build of amp_inspect's compiled extension, amp_inspect._C.

CPU kernels are always built, and so is the CPU emulation of the CUDA kernels that the tests run
(csrc/tensor_stats_emu.cpp). CUDA kernels are built whenever torch is a CUDA build and nvcc is found, also on
a machine with no GPU visible: then TORCH_CUDA_ARCH_LIST defaults to every NVIDIA generation from Ampere to
Blackwell (DEFAULT_ARCHS, plus PTX of the newest for later GPUs) and CUDA_HOME to /usr/local/cuda where it
exists. A machine with a GPU builds for that GPU only (torch's default), or for TORCH_CUDA_ARCH_LIST.
AMP_INSPECT_NO_CUDA=1 skips the CUDA kernels; DEBUG=1 builds with -g -O0.
Never built with fast-math: the kernels count float32 subnormals that fast-math would flush.
Every translation unit is compiled as C++20 (the CUDA emulation uses std::atomic_ref), whatever standard the
torch at hand would pass (torch before 2.14 passes -std=c++17).
"""

import os
import re
import shutil
import sys
from pathlib import Path

from setuptools import setup

DEFAULT_CUDA_HOME = "/usr/local/cuda"
# A100 / A10 and RTX 30xx / L4 and RTX 40xx / H100 and H200 / B200 / RTX 50xx, and PTX for what comes next.
DEFAULT_ARCHS = "8.0;8.6;8.9;9.0;10.0;12.0+PTX"


def _prepare_cuda_env() -> None:
    # Must run before torch.utils.cpp_extension is imported: it reads CUDA_HOME at import time. A wrapper
    # nvcc on PATH (e.g. /usr/local/bin/nvcc) would otherwise mislead its toolkit detection.
    unset = "CUDA_HOME" not in os.environ and "CUDA_PATH" not in os.environ
    if unset and Path(DEFAULT_CUDA_HOME, "bin", "nvcc").exists():
        os.environ["CUDA_HOME"] = DEFAULT_CUDA_HOME


_prepare_cuda_env()

import torch  # noqa: E402

# The oldest torch the extension supports; pyproject.toml says the same.
MIN_TORCH = (2, 10)


def _check_torch() -> None:
    found = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if found < MIN_TORCH:
        raise SystemExit(
            f"amp_inspect needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} to build, found {torch.__version__}: "
            f"`pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'` and build again with --no-build-isolation."
        )


_check_torch()
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = Path(__file__).parent
CSRC = "csrc"
OPENMP = ["-fopenmp"] if sys.platform.startswith("linux") else []


def _want_cuda() -> bool:
    if os.environ.get("AMP_INSPECT_NO_CUDA") == "1":
        return False
    if torch.version.cuda is None:
        return False
    nvcc = Path(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    return bool(nvcc and nvcc.exists()) or shutil.which("nvcc") is not None


def _built_archs() -> str:
    """The images this build puts in the binary, e.g. "sm_80 sm_90 compute_90" (compute_XY: PTX), read from the
    -gencode flags torch will pass to nvcc; amp_inspect.info prints it and checks the visible GPU against it."""
    try:
        from torch.utils.cpp_extension import _get_cuda_arch_flags

        images = set()
        for flag in _get_cuda_arch_flags():
            match = re.search(r",code=\[?([\w,]+)\]?$", flag)
            if match:
                images.update(match.group(1).split(","))
        return " ".join(sorted(images, key=lambda c: (int("".join(filter(str.isdigit, c))), c)))
    except Exception:  # a private torch helper: fall back to the list as given
        return os.environ.get("TORCH_CUDA_ARCH_LIST", "detected")


def _extension():
    debug = os.environ.get("DEBUG") == "1"
    opt = ["-g", "-O0"] if debug else ["-O3"]
    # -fopenmp: ATen's parallel_for is an inline OpenMP loop, serial unless the extension is built with it.
    # -Wno-unknown-pragmas: the emulated CUDA kernels carry nvcc's `#pragma unroll`; GCC before 13 cannot be
    # silenced from the source (`#pragma GCC diagnostic` misses preprocessor warnings, GCC bug 53431).
    # -std=c++20 given here stops torch from adding its own (c++17 before torch 2.14).
    cxx = [*opt, "-std=c++20", "-fno-fast-math", "-Wno-unknown-pragmas", *OPENMP]
    sources = [f"{CSRC}/tensor_stats.cpp", f"{CSRC}/tensor_stats_cpu.cpp", f"{CSRC}/tensor_stats_emu.cpp"]
    if not _want_cuda():
        return CppExtension("amp_inspect._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=OPENMP)
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = DEFAULT_ARCHS
    defines = ["-DAMPI_WITH_CUDA", f'-DAMPI_CUDA_ARCHS="{_built_archs()}"']
    # nvcc compiles the architectures of the list in parallel threads (one per core, at most one per arch).
    nvcc = [*opt, "-std=c++20", "-lineinfo", f"--threads={min(os.cpu_count() or 1, 8)}", *defines]
    return CUDAExtension(
        "amp_inspect._C",
        [*sources, f"{CSRC}/tensor_stats_cuda_op.cpp", f"{CSRC}/tensor_stats_cuda.cu"],
        extra_compile_args={"cxx": [*cxx, *defines], "nvcc": nvcc},
        extra_link_args=OPENMP,
    )


setup(
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension},
)
