"""The build's own promises, checked without compiling: the oldest torch it accepts, what pyproject.toml
says, the C++ standard every translation unit is compiled under."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _setup_with_fake_torch(tmp_path: Path, version: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return subprocess.run(
        [sys.executable, str(REPO / "setup.py"), "--version"],
        cwd=REPO,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("version", ["2.9.1+cu128", "2.6.0", "1.13.1"])
def test_older_torch_refused_in_one_sentence(tmp_path, version):
    result = _setup_with_fake_torch(tmp_path, version)
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == [
        f"amp_inspect needs torch >= 2.10 to build, found {version}: `pip install 'torch>=2.10'` and build "
        "again with --no-build-isolation."
    ]


def test_pyproject_states_the_supported_torch_and_setuptools():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "torch>=2.10" in meta["project"]["dependencies"]
    assert "torch>=2.10" in meta["build-system"]["requires"]
    # project.license as an SPDX string needs setuptools 77.
    assert isinstance(meta["project"]["license"], str)
    assert "setuptools>=77" in meta["build-system"]["requires"]
    assert '"setuptools>=77"' in (REPO / "Makefile").read_text()
    assert re.search(r"MIN_TORCH = \(2, 10\)", (REPO / "setup.py").read_text())


def test_every_translation_unit_is_cxx20():
    """torch before 2.14 passes -std=c++17; the CUDA emulation needs C++20 (std::atomic_ref)."""
    text = (REPO / "setup.py").read_text()
    assert re.search(r'\n    cxx = \[[^\]]*"-std=c\+\+20"', text)
    assert re.search(r'\n    nvcc = \[[^\]]*"-std=c\+\+20"', text)


def test_csrc_uses_the_stable_abi_only():
    """One binary for every torch from 2.10 on: no ATen, c10 or torch/library.h header anywhere in csrc/ (they
    bind the binary to the torch it was built against), and the stable ABI targeted at 2.10."""
    unstable = re.compile(r"#include\s*<(ATen/|c10/|torch/library\.h|torch/extension\.h|torch/torch\.h)")
    offenders = [
        f"{path.relative_to(REPO).as_posix()}:{n}: {line.strip()}"
        for path in sorted((REPO / "csrc").rglob("*"))
        if path.is_file()
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if unstable.search(line)
    ]
    assert offenders == []
    text = (REPO / "setup.py").read_text()
    assert '"-DTORCH_TARGET_VERSION=0x020a000000000000"' in text
    assert text.count("py_limited_api=True") == 4  # _C in both branches, _C_cuda, _C_emu


def _run_with_torch_cuda(version: str | None) -> subprocess.CompletedProcess:
    """Imports amp_inspect in a fresh process where torch reports CUDA `version` (a torch of another CUDA major)."""
    code = (
        "import warnings, torch\n"
        f"torch.version.cuda = {version!r}\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from amp_inspect.core import ops as _ops\n"
        "print([str(w.message) for w in caught if 'amp_inspect' in str(w.message)])\n"
        "print(_ops.has_kernel('cpu'), _ops.has_kernel('cuda'), _ops.CUDA_OFF)\n"
    )
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def _build_has_cuda() -> bool:
    from amp_inspect.core import ops as _ops

    return _ops.build_info().get("cuda") == "1"


@pytest.mark.skipif(not _build_has_cuda(), reason="the build holds no CUDA kernels (no nvcc, or AMP_INSPECT_NO_CUDA=1)")
def test_cuda_kernels_off_beside_a_torch_of_another_cuda_major():
    """A cu13 binary beside a cu12 torch: it imports, serves the CPU kernels, and one line says why the CUDA
    kernels are off and how to build them; beside its own CUDA major the CUDA kernels load, silently."""
    from amp_inspect.core import ops as _ops

    major = _ops.build_info()["cuda_major"]
    other = "12.8" if major != "12" else "13.0"
    lines = _run_with_torch_cuda(other).stdout.splitlines()
    warned, kernels = eval(lines[0]), lines[1]  # noqa: S307 - our own print of a list of str
    assert len(warned) == 1 and "\n" not in warned[0]
    assert warned[0].startswith(f"amp_inspect: its CUDA kernels are off: they were built for CUDA {major} ")
    assert "pip install --no-build-isolation" in warned[0]
    assert kernels.startswith("True False amp_inspect: its CUDA kernels are off")
    lines = _run_with_torch_cuda(f"{major}.0").stdout.splitlines()
    assert lines == ["[]", "True True None"]


def _setup_with_fake_cuda_torch(tmp_path: Path, cuda: str, archs: str = "9.0") -> subprocess.CompletedProcess:
    """setup.py --version beside a fake torch of CUDA `cuda` on a machine without a GPU, the system toolkit hidden,
    downloads forbidden; ``archs``: TORCH_CUDA_ARCH_LIST ("" leaves it unset)."""
    fake = tmp_path / "torch"
    (fake / "utils").mkdir(parents=True)
    (fake / "__init__.py").write_text(
        f"__version__ = '2.11.0+cu{cuda.replace('.', '')}'\n"
        f"class version:\n    cuda = {cuda!r}\n"
        "class cuda:\n    is_available = staticmethod(lambda: False)\n"
    )
    (fake / "utils" / "__init__.py").write_text("")
    (fake / "utils" / "cpp_extension.py").write_text(
        "from setuptools import Extension\n"
        "from setuptools.command.build_ext import build_ext as BuildExtension\n"
        "def CppExtension(name, sources, **kwargs):\n    return Extension(name, sources)\n"
        "CUDAExtension = CppExtension\n"
    )
    env = {
        "PYTHONPATH": str(tmp_path),
        "PATH": "/usr/bin:/bin",
        "AMP_INSPECT_IGNORE_SYSTEM_CUDA": "1",
        "AMP_INSPECT_FETCH_NVCC": "0",
        **({"TORCH_CUDA_ARCH_LIST": archs} if archs else {}),
    }
    return subprocess.run(
        [sys.executable, str(REPO / "setup.py"), "--version"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _loud(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    return [line for line in result.stderr.splitlines() if line.startswith("*** amp_inspect")]


def test_no_nvcc_to_be_had_is_said_in_one_line_with_the_fix(tmp_path):
    """A CUDA 13 torch, the system toolkit hidden and the download forbidden: the build goes on with the CPU
    kernels and says why in one line, naming the PyPI packages that fix it (for torch's CUDA version)."""
    assert _loud(_setup_with_fake_cuda_torch(tmp_path, "13.0")) == [
        "*** amp_inspect: building WITHOUT the CUDA kernels: no nvcc for CUDA 13.0 found and none could be "
        "installed; fix: `pip install nvidia-cuda-nvcc==13.0.* nvidia-nvvm==13.0.* nvidia-cuda-crt==13.0.* "
        "nvidia-cuda-cccl==13.0.*` and build again with --no-build-isolation."
    ]


def test_no_gpu_and_no_arch_list_builds_the_cpu_kernels_and_says_how_to_build_cuda(tmp_path):
    """No GPU visible and TORCH_CUDA_ARCH_LIST unset (a laptop, a CI runner): the CPU kernels only, at once (no
    nvcc looked for or downloaded), and one line with the command that builds the CUDA kernels anyway."""
    (line,) = _loud(_setup_with_fake_cuda_torch(tmp_path, "13.0", archs=""))
    assert line.startswith(
        "*** amp_inspect: building WITHOUT the CUDA kernels: no GPU is visible and TORCH_CUDA_ARCH_LIST is not set"
    )
    assert "`TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e .`" in line and "8.0;8.6" in line


def test_each_target_compiles_in_a_folder_of_its_own(tmp_path):
    """common/op.cpp goes into _C and _C_emu (and _C_cuda) with different flags: one build folder per target, so no
    target's object overwrites another's (each source compiled once per target) and rebuilds keep them. Beside a
    fake CPU-only torch whose builder prints where each extension would compile instead of compiling."""
    temp = tmp_path / "temp"
    builder = (
        "    def build_extension(self, ext):\n"
        "        print('TEMP', ext.name, self.build_temp)\n"
        "    def copy_extensions_to_source(self):\n"
        "        pass\n"
    )
    printed = _build_ext_beside_a_fake_torch(tmp_path, builder, "--inplace", "--build-temp", str(temp))
    folders = dict(line.split()[1:] for line in printed if line.startswith("TEMP"))
    assert folders == {"amp_inspect._C": str(temp / "_C"), "amp_inspect._C_emu": str(temp / "_C_emu")}


def test_cuda_12_without_a_toolkit_says_pypi_has_no_nvcc(tmp_path):
    """CUDA 12 (torch 2.10's cu128): PyPI's nvidia-cuda-nvcc-cu12 holds ptxas only, so the line names a toolkit
    install instead of a pip command that would not help."""
    (line,) = _loud(_setup_with_fake_cuda_torch(tmp_path, "12.8"))
    assert line.startswith(
        "*** amp_inspect: building WITHOUT the CUDA kernels: no nvcc for CUDA 12.8 found, and PyPI has none for "
        "CUDA 12 (nvidia-cuda-nvcc-cu12 holds ptxas only); fix: `conda install -c nvidia cuda-nvcc=12.8"
    )
    assert "pip install" not in line


def _build_ext_beside_a_fake_torch(tmp_path: Path, builder: str, *build_ext_args: str) -> list[str]:
    """The lines ``setup.py build_ext ARGS`` prints beside a fake CPU-only torch whose BuildExtension has the
    methods of ``builder`` (source text, indented for the class body) and compiles nothing."""
    fake = tmp_path / "torch"
    (fake / "utils").mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text(
        "__version__ = '2.11.0+cpu'\nclass version:\n    cuda = None\n"
        "class cuda:\n    is_available = staticmethod(lambda: False)\n"
    )
    (fake / "utils" / "__init__.py").write_text("")
    (fake / "utils" / "cpp_extension.py").write_text(
        "from setuptools import Extension\n"
        "from setuptools.command.build_ext import build_ext\n"
        f"class BuildExtension(build_ext):\n{builder}"
        "def CppExtension(name, sources, **kwargs):\n    return Extension(name, sources)\n"
        "CUDAExtension = CppExtension\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "AMP_INSPECT_NO_CUDA": "1"}
    result = subprocess.run(
        [sys.executable, str(REPO / "setup.py"), "build_ext", *build_ext_args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _built_extensions(tmp_path: Path, *build_ext_args: str) -> list[str]:
    """The extensions ``setup.py build_ext ARGS`` would compile (a fake builder prints them instead)."""
    builder = (
        "    def build_extensions(self):\n"
        "        print('BUILDS', *sorted(e.name for e in self.extensions))\n"
        "        raise SystemExit(0)  # nothing compiled, nothing to copy\n"
    )
    printed = _build_ext_beside_a_fake_torch(tmp_path, builder, *build_ext_args)
    (line,) = [line for line in printed if line.startswith("BUILDS")]
    return line.split()[1:]


def test_the_emulated_ops_are_built_in_place_and_left_out_of_a_wheel(tmp_path):
    """The test-only amp_inspect._C_emu is built by in-place builds (make setup's editable install, build_ext
    --inplace) and not by the build a wheel runs (build_ext into a build folder)."""
    inplace = _built_extensions(tmp_path, "--inplace")
    assert inplace == ["amp_inspect._C", "amp_inspect._C_emu"]
    for_wheel = _built_extensions(tmp_path, "--build-lib", str(tmp_path / "lib"), "--build-temp", str(tmp_path / "t"))
    assert for_wheel == ["amp_inspect._C"]


def test_the_shipped_library_holds_no_emulated_op():
    """amp_inspect._C (what a wheel ships) registers the users' ops only; amp_inspect._C_emu adds the tests'."""
    code = (
        "import importlib.util, torch, amp_inspect.core._native\n"
        "ops = torch.ops.amp_inspect\n"
        "print(hasattr(ops, 'tensor_stats'), hasattr(ops, '_tensor_stats_emulated'))\n"
        "if importlib.util.find_spec('amp_inspect._C_emu'):\n"
        "    import amp_inspect._C_emu\n"
        "    print(hasattr(ops, '_tensor_stats_emulated'), hasattr(ops, '_unscale_stats_emulated_'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "True False"
    assert lines[1:] in ([], ["True True"])
