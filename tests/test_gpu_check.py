"""bench/gpu_check.sh without a GPU (issue 17, E): every stage says why it cannot run, the summary is still
written, the exit status says "nothing measured"; and bench/gpu_summary.py's statuses and caps."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import gpu_summary  # noqa: E402

STAGES = ["install", "info", "tests", "memcheck", "racecheck", "synccheck", "bench", "bench_step", "dist"]


def dry_run(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The GPU hidden from torch, so this is a dry run on any machine."""
    environment = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", str(BENCH / "gpu_check.sh"), str(out)], capture_output=True, text=True, env=environment, timeout=300
    )


@pytest.mark.parametrize("with_wheel", [True, False])
def test_dry_run_says_why_each_stage_cannot_run_and_that_nothing_was_measured(tmp_path, with_wheel):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    if with_wheel:
        (wheels / "amp_inspect-0.1.0-cp310-abi3-linux_x86_64.whl").write_bytes(b"")
    result = dry_run(tmp_path / "out", WHEEL_DIR=str(wheels))
    assert result.returncode == gpu_summary.NOTHING_MEASURED == 3, result.stdout + result.stderr
    for name in STAGES:
        assert f"=== {name}: cannot run: no CUDA GPU visible to torch" in result.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["exit_status"] == 3 and summary["measured"] is False
    # What comes back from a device that returns at most 8 files: the summary and one tarball with everything.
    files = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert len(files) == 2 and files[0].startswith("gpu_check-") and files[0].endswith(".tar.gz"), files
    assert files[1] == "summary.json"
    with tarfile.open(tmp_path / "out" / files[0]) as packed:
        names = {Path(n).name for n in packed.getnames()}
    assert {"summary.json", "stages.tsv", "plan.tsv", "machine.txt"} <= names
    assert list(summary["stages"]) == STAGES
    assert all(s["status"] == "not-run" and "nothing to measure" in s["note"] for s in summary["stages"].values())
    plan = summary["plan"]
    assert plan["caps_s"]["install"] == (30 if with_wheel else 240)
    # With the wheel the caps add up to the budget; a build takes its time from the last stages.
    assert (plan["caps_total_s"] == plan["budget_s"] == 450) is with_wheel


def write_stages(out: Path, rows: list[tuple[str, str]]) -> None:
    out.mkdir(exist_ok=True)
    (out / "stages.tsv").write_text("".join(f"{n}\t{s}\t0\t1\t10\t\n" for n, s in rows))


@pytest.mark.parametrize(
    ("rows", "status"),
    [
        ([("install", "passed"), ("info", "passed"), ("tests", "passed")], 0),
        ([("install", "passed"), ("info", "passed"), ("tests", "failed")], 1),
        ([("install", "passed"), ("info", "passed"), ("tests", "timeout")], 1),
        ([("install", "passed"), ("info", "passed"), ("dist", "skipped")], 4),
        ([("install", "passed"), ("info", "not-run"), ("tests", "not-run")], 3),
        ([("install", "not-run"), ("info", "not-run")], 3),
    ],
)
def test_exit_status_from_the_stages(tmp_path, rows, status):
    write_stages(tmp_path, rows)
    assert gpu_summary.main(tmp_path) == status
    assert json.loads((tmp_path / "summary.json").read_text())["exit_status"] == status


def test_bench_ratios_are_carried_into_the_summary(tmp_path):
    write_stages(tmp_path, [("install", "passed"), ("bench", "passed")])
    measurement = {"set_name": "gpt2-style", "method": "reference", "median_ms": 2.0, "gb_per_s": 1, "x_roofline": 9}
    (tmp_path / "tensor_stats_cuda.json").write_text(json.dumps({"measurements": [measurement], "launches": []}))
    summary = gpu_summary.summarize(tmp_path)
    assert summary["tensor_stats_cuda"]["ratios"] == [measurement]
    assert summary["step_cuda"] == "not written"


def test_the_sanitizers_run_without_the_caching_allocator() -> None:
    """With torch's caching allocator on, an access past a tensor's end lands in a neighbouring cached block and
    memcheck does not see it: every sanitizer stage runs with PYTORCH_NO_CUDA_MEMORY_CACHING=1."""
    script = (BENCH / "gpu_check.sh").read_text()
    assert re.search(r"nocache=\(env PYTORCH_NO_CUDA_MEMORY_CACHING=1\)", script)
    for tool in ("memcheck", "racecheck", "synccheck"):
        line = script.split(f"stage {tool} ", 1)[1].split("\n", 1)[0]
        assert '"${nocache[@]}" "$sanitizer"' in line, line


def test_the_tests_stage_names_every_test_file_with_cuda_tests_and_only_files_that_exist() -> None:
    """A file renamed or folded away made pytest stop the GPU run before any test ("file or directory not found"),
    and files whose tests a shared parametrization marks cuda (tests/models.py's DEVICES) were left out."""
    script = (BENCH / "gpu_check.sh").read_text()
    named = set(re.search(r'cuda_tests="([^"]*)"', script).group(1).replace("\\\n", " ").split())
    tests = BENCH.parent / "tests"
    assert {n for n in named if not (BENCH.parent / n).is_file()} == set()
    marked = {
        f"tests/{f.name}"
        for f in tests.glob("test_*.py")
        if f.name != Path(__file__).name  # this test's own pattern
        and re.search(r"mark\.cuda\b(?!_)|\bDEVICES\b", f.read_text())
    }
    assert marked - named == {"tests/test_distributed.py"}  # the dist stage runs that one
    assert "tests/test_distributed.py" in script.split("stage dist", 1)[1].split("\n", 1)[0]
