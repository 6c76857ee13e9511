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
    assert re.search(r'cxx = \[[^\]]*"-std=c\+\+20"', text)
    assert re.search(r'nvcc = \[[^\]]*"-std=c\+\+20"', text)
