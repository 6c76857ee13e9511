"""Build of amp_inspect's compiled libraries: amp_inspect._C (schemas, CPU kernels) and amp_inspect._C_cuda (the
CUDA kernels), both on torch's stable ABI targeted at torch 2.10 and Python's limited API of 3.10: one binary for
every torch from 2.10 on (a cp310-abi3 wheel). Beside them, for the tests only, amp_inspect._C_emu (the CUDA
kernels' source compiled for the CPU, tests/test_cuda_emu.py): built by in-place and editable builds
(`build_ext --inplace`, `pip install -e`, `make setup`), never put in a wheel (`make wheel`, `pip install .`).

CUDA kernels are built where they can run: torch is a CUDA build and a GPU is visible (for that GPU's arch, torch's
default), or TORCH_CUDA_ARCH_LIST names the archs to build for (`make wheel`: every NVIDIA generation from Ampere to
Blackwell, DEFAULT_ARCHS, plus PTX of the newest for later GPUs). A machine with no GPU and no TORCH_CUDA_ARCH_LIST
builds the CPU kernels (and the tests' emulation) only, in minutes rather than the better part of an hour, and says
in one line how to build the CUDA kernels anyway. The nvcc used is the first of CUDA_HOME, CUDA_PATH,
/usr/local/cuda and PATH whose CUDA major is torch's; without one, NVIDIA's nvcc for torch's CUDA version is
installed from PyPI into this environment (AMP_INSPECT_FETCH_NVCC=0: never) and used. Where no nvcc can be had, the
build says so in one line with the command that fixes it. AMP_INSPECT_IGNORE_SYSTEM_CUDA=1 hides the system toolkit
(to test the PyPI route). AMP_INSPECT_NO_CUDA=1 skips the CUDA kernels; DEBUG=1 builds with -g -O0.
Each target (_C, _C_cuda, _C_emu) compiles in a build folder of its own: a source two targets share
(common/op.cpp) is compiled once per target, with that target's flags, and a rebuild of one never redoes the
other's objects.
Never built with fast-math: the kernels count float32 subnormals that fast-math would flush.
Every translation unit is compiled as C++20 (the CUDA emulation uses std::atomic_ref), whatever standard the
torch at hand would pass (torch before 2.14 passes -std=c++17).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup

DEFAULT_CUDA_HOME = "/usr/local/cuda"
# A100 / A10 and RTX 30xx / L4 and RTX 40xx / H100 and H200 / B200 / RTX 50xx, and PTX for what comes next.
DEFAULT_ARCHS = "8.0;8.6;8.9;9.0;10.0;12.0+PTX"
# The oldest torch the extension supports; pyproject.toml says the same.
MIN_TORCH = (2, 10)

import torch  # noqa: E402


def _check_torch() -> None:
    found = tuple(int(part) for part in re.findall(r"\d+", torch.__version__)[:2])
    if found < MIN_TORCH:
        raise SystemExit(
            f"amp_inspect needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} to build, found {torch.__version__}: "
            f"`pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}'` and build again with --no-build-isolation."
        )


_check_torch()


def _say(line: str) -> None:
    """One loud line in the build output (pip shows a build's stderr with -v, and always when it fails)."""
    print(f"\n*** amp_inspect: {line}\n", file=sys.stderr, flush=True)


def _nvcc_release(nvcc: Path) -> str | None:
    """ "13.0" for the nvcc at this path, None when it does not run."""
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+\.\d+)", out)
    return match.group(1) if match else None


def _same_major(a: str | None, b: str) -> bool:
    return a is not None and a.split(".")[0] == b.split(".")[0]


# NVIDIA's compiler and headers as Python packages, for CUDA 13 and later: the pieces a build of the .cu needs
# (nvcc, its NVVM back end and crt headers, CCCL's <nv/target>); the runtime headers and libcudart come with
# torch. CUDA 12 has none (its nvidia-cuda-nvcc-cu12 holds ptxas alone).
def _toolkit_packages(cuda: str) -> list[str]:
    major, minor = cuda.split(".")[:2]
    if major == "12":
        return []  # nvidia-cuda-nvcc-cu12 holds ptxas only, no nvcc: PyPI has no CUDA 12 compiler
    return [
        f"{name}=={major}.{minor}.*"
        for name in ("nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-cccl")
    ]


def _site_nvidia() -> list[Path]:
    import site

    roots = [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(root, "nvidia") for root in roots if Path(root, "nvidia").is_dir()]


def _pip_nvcc(cuda: str) -> Path | None:
    """nvcc from NVIDIA's PyPI packages in this environment (nvidia/cu13/bin/nvcc, nvidia/cuda_nvcc/bin/nvcc)."""
    for nvidia in _site_nvidia():
        for nvcc in (nvidia / f"cu{cuda.split('.')[0]}" / "bin" / "nvcc", nvidia / "cuda_nvcc" / "bin" / "nvcc"):
            if nvcc.exists() and _same_major(_nvcc_release(nvcc), cuda):
                return nvcc
    return None


# Where the CUDA kernels come from, decided before torch.utils.cpp_extension is imported (it reads CUDA_HOME
# at import time): None (no CUDA kernels, NO_CUDA_REASON says why) or the nvcc to use.
NO_CUDA_REASON = ""
PIP_TOOLKIT = False


def _find_nvcc() -> Path | None:
    global NO_CUDA_REASON, PIP_TOOLKIT
    cuda = torch.version.cuda
    if os.environ.get("AMP_INSPECT_NO_CUDA") == "1":
        NO_CUDA_REASON = "AMP_INSPECT_NO_CUDA=1"
        return None
    if cuda is None:
        NO_CUDA_REASON = f"torch {torch.__version__} is a CPU-only build"
        return None
    if not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        NO_CUDA_REASON = (
            "no GPU is visible and TORCH_CUDA_ARCH_LIST is not set; to build them anyway, name the archs: "
            f"`TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e .` (your GPU's; `make wheel` builds "
            f"{DEFAULT_ARCHS})"
        )
        return None
    # AMP_INSPECT_IGNORE_SYSTEM_CUDA=1: build as on a machine without a CUDA toolkit (CUDA_HOME, CUDA_PATH,
    # /usr/local/cuda and nvcc on PATH ignored), so that the PyPI route below is what runs.
    if os.environ.get("AMP_INSPECT_IGNORE_SYSTEM_CUDA") != "1":
        candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), DEFAULT_CUDA_HOME]
        for home in filter(None, candidates):
            nvcc = Path(home, "bin", "nvcc")
            if nvcc.exists() and _same_major(_nvcc_release(nvcc), cuda):
                return nvcc
        on_path = shutil.which("nvcc")
        if on_path and _same_major(_nvcc_release(Path(on_path)), cuda):
            return Path(on_path)
    nvcc = _pip_nvcc(cuda)
    packages = _toolkit_packages(cuda)
    if nvcc is None and not packages:
        NO_CUDA_REASON = (
            f"no nvcc for CUDA {cuda} found, and PyPI has none for CUDA {cuda.split('.')[0]} (nvidia-cuda-nvcc-cu12 "
            f"holds ptxas only); fix: `conda install -c nvidia cuda-nvcc={cuda} cuda-cudart-dev={cuda}` (or NVIDIA's "
            "installer), set CUDA_HOME to that toolkit and build again with --no-build-isolation"
        )
        return None
    if nvcc is None and os.environ.get("AMP_INSPECT_FETCH_NVCC", "1") != "0":
        _say(
            f"no nvcc for CUDA {cuda} (torch {torch.__version__}) found; installing NVIDIA's from PyPI: "
            + " ".join(packages)
        )
        result = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *packages]
        )
        nvcc = _pip_nvcc(cuda) if result.returncode == 0 else None
    if nvcc is None:
        NO_CUDA_REASON = (
            f"no nvcc for CUDA {cuda} found and none could be installed; fix: "
            f"`pip install {' '.join(packages)}` and build again with --no-build-isolation"
        )
        return None
    PIP_TOOLKIT = True
    return nvcc


NVCC = _find_nvcc()
if NVCC is not None:
    os.environ["CUDA_HOME"] = str(NVCC.parent.parent)
    os.environ.pop("CUDA_PATH", None)

from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension  # noqa: E402

ROOT = Path(__file__).parent
CSRC = "csrc"
# Sources include each other by their path under csrc/ ("common/numerics.h"); absolute, since torch's ninja build
# compiles from the build folder.
INCLUDE_DIRS = [str((ROOT / CSRC).resolve())]
EMU_EXTENSION = "amp_inspect._C_emu"  # tests only: built in place, never in a wheel (BuildStableExtension)
# The ops, a folder of csrc/ each: csrc/<op>/<op>_cpu.cpp (the CPU kernel, in _C), <op>_cuda_op.cpp and
# <op>_cuda.cu (the CUDA op and the GPU build of its kernels, in _C_cuda), <op>_emu.cpp (its kernels emulated, in
# the test-only _C_emu). What every op shares is csrc/common/ (common/op.cpp in each library); the schemas and
# layout() are csrc/module.cpp. Format readiness (issue 21) and update_stats (issue 22) joined tensor_stats.
OPS = ("tensor_stats", "readiness", "update_stats")


def _op_sources(*kinds: str) -> list[str]:
    """Every op's sources of these kinds, e.g. ("cpu.cpp",): csrc/tensor_stats/tensor_stats_cpu.cpp, ..."""
    return [f"{CSRC}/{op}/{op}_{kind}" for op in OPS for kind in kinds]


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


# The stable ABI of the oldest supported torch: the binary then loads on every torch from 2.10 on.
TORCH_TARGET = "-DTORCH_TARGET_VERSION=0x020a000000000000"


def _cuda_major() -> str:
    return (torch.version.cuda or "0").split(".")[0]


def _pip_toolkit_paths() -> dict[str, list[str]]:
    """NVIDIA's PyPI packages spread the toolkit over several folders (the runtime headers and libcudart.so.N
    with torch's nvidia-cuda-runtime, CCCL apart) and ship no unversioned libcudart.so to link with: the
    include folders, and a folder under build/ with that link."""
    if not PIP_TOOLKIT:
        return {}
    major = torch.version.cuda.split(".")[0]
    includes, libs = [], []
    for nvidia in _site_nvidia():
        for sub in (f"cu{major}", "cuda_runtime", "cuda_nvcc", "cuda_cccl"):
            if Path(nvidia, sub, "include").is_dir():
                includes.append(str(Path(nvidia, sub, "include")))
            libs += sorted(Path(nvidia, sub, "lib").glob(f"libcudart.so.{major}*"))
    if not libs:
        return {"include_dirs": includes}
    link_dir = ROOT / "build" / f"cuda{major}-link"
    link_dir.mkdir(parents=True, exist_ok=True)
    link = link_dir / "libcudart.so"
    link.unlink(missing_ok=True)
    link.symlink_to(libs[0])
    return {"include_dirs": includes, "library_dirs": [str(link_dir)]}


def _extensions():
    debug = os.environ.get("DEBUG") == "1"
    opt = ["-g", "-O0"] if debug else ["-O3"]
    host_opt = opt if debug else [*opt, "-g0"]
    # -std=c++20 given here stops torch from adding its own (c++17 before torch 2.14).
    # -Wno-unknown-pragmas: the emulated CUDA kernels carry nvcc's `#pragma unroll`; GCC before 13 cannot be
    # silenced from the source (`#pragma GCC diagnostic` misses preprocessor warnings, GCC bug 53431).
    # -fvisibility=hidden: as torch's stable namespaces; only PyInit__C is exported, and _C and _C_cuda, which
    # both hold common/op.cpp and each op's checks (<op>_call.h), never bind to each other's copy.
    # -g0 (host compiler only): Python's own CFLAGS carry -g, which would triple the libraries' size.
    # -Wno-psabi: GCC notes that a vector argument's ABI changed in GCC 4.6 wherever a vectorised helper is not
    # inlined into a clone; every such function is internal to its file, so no caller across an ABI exists.
    cxx = [
        *host_opt,
        "-std=c++20",
        "-fno-fast-math",
        "-Wno-unknown-pragmas",
        "-Wno-psabi",
        "-fvisibility=hidden",
        TORCH_TARGET,
    ]
    common = f"{CSRC}/common/op.cpp"
    sources = [f"{CSRC}/module.cpp", common, *_op_sources("cpu.cpp")]
    # The test-only emulated ops: a library of their own (it holds its own copy of common/op.cpp and of each op's
    # checks, as _C_cuda does), loaded after _C, whose schema library its ops join.
    emu_sources = [common, *_op_sources("emu.cpp")]
    emu = CppExtension(
        EMU_EXTENSION, emu_sources, include_dirs=INCLUDE_DIRS, extra_compile_args={"cxx": cxx}, py_limited_api=True
    )
    # py_limited_api: compiled with Py_LIMITED_API (CPython 3.10's), linked without libtorch_python.
    if NVCC is None:
        if NO_CUDA_REASON != "AMP_INSPECT_NO_CUDA=1":
            _say(f"building WITHOUT the CUDA kernels: {NO_CUDA_REASON}.")
        cpu = CppExtension(
            "amp_inspect._C", sources, include_dirs=INCLUDE_DIRS, extra_compile_args={"cxx": cxx}, py_limited_api=True
        )
        return [cpu, emu]
    defines = ["-DAMPI_WITH_CUDA", f'-DAMPI_CUDA_ARCHS="{_built_archs()}"', f"-DAMPI_CUDA_MAJOR={_cuda_major()}"]
    cpu = CppExtension(
        "amp_inspect._C",
        sources,
        include_dirs=INCLUDE_DIRS,
        extra_compile_args={"cxx": [*cxx, *defines]},
        py_limited_api=True,
    )
    # The CUDA kernels in a library of their own: amp_inspect loads it only beside a torch of the CUDA major it
    # was built for, so a wheel beside a torch of another CUDA major still serves its CPU kernels.
    # nvcc compiles the architectures of the list in parallel threads (one per core, at most one per arch).
    nvcc = [
        *opt,
        "-std=c++20",
        "-Xcompiler=-fvisibility=hidden",
        "-lineinfo",
        f"--threads={min(os.cpu_count() or 1, 8)}",
        TORCH_TARGET,
        *defines,
    ]
    toolkit = _pip_toolkit_paths()
    cuda = CUDAExtension(
        "amp_inspect._C_cuda",
        [common, *_op_sources("cuda_op.cpp", "cuda.cu")],
        include_dirs=[*INCLUDE_DIRS, *toolkit.pop("include_dirs", [])],
        extra_compile_args={"cxx": [*cxx, *defines, "-DUSE_CUDA"], "nvcc": nvcc},
        py_limited_api=True,
        **toolkit,
    )
    return [cpu, cuda, emu]


class BuildStableExtension(BuildExtension):
    """torch's BuildExtension, which first removes a _C built before the stable-ABI port: Python would import its
    version-tagged name (_C.cpython-311-x86_64-linux-gnu.so) before the new _C.abi3.so. It builds the test-only
    _C_emu only in place (`build_ext --inplace`, and editable installs, which set editable_mode): a build for a
    wheel (`bdist_wheel`, `pip install .`) leaves it out, so the shipped binaries hold only what users call."""

    def build_extension(self, ext: Extension) -> None:
        """Each target in a build folder of its own (module docstring): the objects of a source two targets share
        never overwrite each other, so each is compiled once per target and kept for the next build."""
        shared = self.build_temp
        self.build_temp = os.path.join(shared, ext.name.rsplit(".", 1)[-1])
        try:
            super().build_extension(ext)
        finally:
            self.build_temp = shared

    def run(self) -> None:
        for stale in (ROOT / "amp_inspect").glob("_C.cpython-*.so"):
            stale.unlink()
        if not (self.inplace or getattr(self, "editable_mode", False)):
            self.extensions = [ext for ext in self.extensions if ext.name != EMU_EXTENSION]
        super().run()


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": BuildStableExtension},
    # The wheel is tagged cp310-abi3: one file for CPython 3.10 and later.
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
