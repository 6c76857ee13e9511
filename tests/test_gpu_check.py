"""bench/gpu_check.sh without a GPU (issue 17, E; issue 30): every stage says why it cannot run, the summary is
still written with the plan, the exit status says "nothing measured"; bench/gpu_summary.py's statuses, caps and
timings table; the benchmark scripts the check runs start on the CPU."""

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
import harness  # noqa: E402

# Most important first: build and correctness on the GPU, then the timings, then the sanitizers.
STAGES = [
    "install", "info", "tests", "dist", "bench", "readiness", "update", "big",
    "memcheck", "racecheck", "synccheck", "bench_step",
]  # fmt: skip
TIMING_STAGES = {"bench", "readiness", "update", "big"}  # whole-call and kernel-only times
SANITIZERS = {"memcheck", "racecheck", "synccheck"}
# The device tool: one command of at most 600 s inside 15 minutes of device time that include the machine's start;
# bench/README.md gives the run call timeout_s=570, and the stages must end before it with time to pack.
RUN_TIMEOUT_S = 570
DEVICE_FILES_MAX = 8


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
    assert (plan["caps_total_s"] == plan["budget_s"] == 540) is with_wheel
    assert summary["timings"] == []


def test_the_dry_run_prints_and_writes_the_plan_within_the_budget_and_eight_files(tmp_path):
    """GPU_CHECK_DRY_RUN=1 (here on a machine without a GPU too): the plan lists the readiness, update and 1B timing
    stages with kernel-only times, the sanitizers with the caching allocator off, and caps within the budget,
    which ends before the run call's timeout; OUT holds at most the 8 files a device brings back."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "amp_inspect-0.2.0-cp310-abi3-linux_x86_64.whl").write_bytes(b"")
    result = dry_run(tmp_path / "out", WHEEL_DIR=str(wheels), GPU_CHECK_DRY_RUN="1")
    assert result.returncode == gpu_summary.NOTHING_MEASURED, result.stdout + result.stderr
    assert len([p for p in (tmp_path / "out").rglob("*") if p.is_file()]) <= DEVICE_FILES_MAX
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    plan = summary["plan"]
    assert [s["name"] for s in plan["stages"]] == STAGES == list(summary["stages"])
    assert all("GPU_CHECK_DRY_RUN=1" in s["note"] for s in summary["stages"].values())
    kinds = {s["name"]: s for s in plan["stages"]}
    assert {n for n, s in kinds.items() if s["kind"] == "timing"} == TIMING_STAGES | {"bench_step"}
    assert all("kernel-only" in kinds[n]["what"] for n in TIMING_STAGES)
    assert {n for n, s in kinds.items() if s["caching_allocator"] == "off"} == SANITIZERS
    assert {n for n, s in kinds.items() if s["kind"] == "sanitizer"} == SANITIZERS
    # The timings come before the sanitizers, which come after every check.
    order = {name: i for i, name in enumerate(STAGES)}
    assert max(order[n] for n in ("tests", "dist")) < min(order[n] for n in TIMING_STAGES)
    assert max(order[n] for n in TIMING_STAGES) < min(order[n] for n in SANITIZERS)
    assert plan["caps_total_s"] == sum(s["cap_s"] for s in plan["stages"]) <= plan["budget_s"] < RUN_TIMEOUT_S
    for name in STAGES:  # the plan is printed too
        assert re.search(rf"^  {name} {kinds[name]['cap_s']} ", result.stdout, re.MULTILINE), name


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


def test_every_timing_is_folded_into_one_table_and_a_csv(tmp_path):
    """tensor_stats', readiness' and update statistics' JSON name their columns differently; the summary's
    timings table and timings.csv hold them in one set of columns, kernel-only times beside whole-call ones."""
    write_stages(tmp_path, [("install", "passed"), ("bench", "passed"), ("readiness", "passed")])
    stats = {"set_name": "1B", "method": "fused_fp16", "median_ms": 2.5, "kernel_ms": 2.0, "x_roofline": 1.1,
             "x_roofline_kernel": 1.05, "times_ms": [2.5]}  # fmt: skip
    readiness = {"set": "act-4M-bf16", "method": "all_recipes", "median_ms": 0.4, "kernel_ms": 0.3,
                 "x_read_median": 4.0, "x_read_kernel": 3.5}  # fmt: skip
    update = {"method": "update_stats", "median_ms": 1.5, "kernel_ms": 1.2, "x_read_median": 0.9, "x_read_kernel": 0.8}
    (tmp_path / "tensor_stats_cuda_1B_quick.json").write_text(json.dumps({"measurements": [stats], "targets": []}))
    (tmp_path / "readiness_cuda.json").write_text(json.dumps({"rows": [readiness], "left_out": []}))
    (tmp_path / "update_cuda_float16.json").write_text(json.dumps({"weights": "float16", "rows": [update]}))
    assert gpu_summary.main(tmp_path) == gpu_summary.ALL_PASSED
    timings = json.loads((tmp_path / "summary.json").read_text())["timings"]
    assert timings == [
        {"file": "readiness_cuda", "set": "act-4M-bf16", "method": "all_recipes", "median_ms": 0.4, "kernel_ms": 0.3,
         "x_read": 4.0, "x_read_kernel": 3.5},
        {"file": "tensor_stats_cuda_1B_quick", "set": "1B", "method": "fused_fp16", "median_ms": 2.5, "kernel_ms": 2.0,
         "x_read": 1.1, "x_read_kernel": 1.05},
        {"file": "update_cuda_float16", "set": "float16", "method": "update_stats", "median_ms": 1.5, "kernel_ms": 1.2,
         "x_read": 0.9, "x_read_kernel": 0.8},
    ]  # fmt: skip
    lines = (tmp_path / "timings.csv").read_text().splitlines()
    assert lines[0] == ",".join(gpu_summary.TIMING_COLUMNS) and len(lines) == 4
    assert lines[2] == "tensor_stats_cuda_1B_quick,1B,fused_fp16,2.5,2.0,1.1,1.05"


def test_kernel_only_time_sums_the_kernels_and_counts_copies_apart() -> None:
    """The profiler's device events: copies and memsets are counted, not timed as kernels; the time is per call."""
    events = [("vectorized_kernel", 30.0), ("Memset (Device)", 2.0), ("Memcpy HtoD (Pinned -> Device)", 5.0),
              ("tensor_stats_kernel", 50.0), ("vectorized_kernel", 30.0), ("tensor_stats_kernel", 50.0)]  # fmt: skip
    timed = harness.device_events(events, calls=2)
    assert (timed.kernels, timed.memcpy, timed.memset) == (4, 1, 1)
    assert timed.kernel_ms == pytest.approx(0.08)  # (30 + 50 + 30 + 50) us over 2 calls


@pytest.mark.parametrize(
    ("script", "methods"),
    [
        ("bench_readiness.py", {"vector_norm", "all_recipes", "mxfp8_e4m3"}),
        ("bench_update_kernel.py", {"read", "update_stats"}),
    ],
)
def test_the_readiness_and_update_benchmarks_run_on_the_cpu(tmp_path, script, methods) -> None:
    """Both scripts asked amp_inspect.core.ops for kernel tables it no longer has (READINESS_KERNELS,
    UPDATE_KERNELS: an AttributeError before any timing); the GPU check's readiness, update and big stages run
    them. On the CPU they still time every method by the whole call, without kernel-only times."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(
        [sys.executable, str(BENCH / script), "--quick", "--out", str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (written,) = tmp_path.glob("*_cpu*_quick.json")
    rows = json.loads(written.read_text())["rows"]
    assert methods <= {r["method"] for r in rows}
    assert all(r["median_ms"] > 0 and r["kernel_ms"] is None for r in rows)


def test_the_1b_set_is_asked_for_by_name_drawn_on_the_gpu_and_refused_on_the_cpu(capsys) -> None:
    """The big stage's arguments give the three 1B sets, drawn on the device; on the CPU the set is refused in one
    sentence; a full CUDA run times fp16 beside fp32 and bf16 and leaves the 1B set out."""
    import bench_tensor_stats

    config = bench_tensor_stats.parse_args(
        ["--device", "cuda", "--set", "1B", "--dtype", "float32", "--dtype", "bfloat16", "--dtype", "float16",
         "--methods", "fused_fp16,gradscaler_check", "--tag", "1B"]
    )  # fmt: skip
    sets = bench_tensor_stats.grad_sets(config)
    assert [(s.name, s.on_device, s.numel) for s in sets] == [
        ("1B", True, 10**9), ("1B-bf16", True, 10**9), ("1B-fp16", True, 10**9)
    ]  # fmt: skip
    assert config.tag == "1B" and config.partial
    full = bench_tensor_stats.grad_sets(bench_tensor_stats.parse_args(["--device", "cuda"]))
    assert {s.name for s in full} >= {"gpt2-style-fp16", "300x75M-fp16", "1000-tiny"}
    assert not any(s.on_device or s.name.startswith("1B") for s in full)
    with pytest.raises(SystemExit):
        bench_tensor_stats.parse_args(["--set", "1B"])
    assert "--set 1B is drawn and measured on the GPU only: add --device cuda" in capsys.readouterr().err


def test_the_sanitizers_run_without_the_caching_allocator(tmp_path) -> None:
    """With torch's caching allocator on, an access past a tensor's end lands in a neighbouring cached block and
    memcheck does not see it: every stage the plan marks "off" (the sanitizers) runs with
    PYTORCH_NO_CUDA_MEMORY_CACHING=1, taken from the plan, and the other stages without it."""
    script = (BENCH / "gpu_check.sh").read_text()
    start = script.index("\nstage() {")
    stage = script[start : script.index("\n}\n", start)]
    # The stage function, run on its own with a plan of one "off" and one "on" stage, writing what each saw.
    runner = tmp_path / "stage.sh"
    runner.write_text(
        "set -uo pipefail\nout=$1; budget=100; only=''\n"
        "declare -A cap_of_stage=([memcheck]=10 [bench]=10) allocator_of_stage=([memcheck]=off [bench]=on)\n"
        'cap_of() { echo "${cap_of_stage[$1]}"; }\nrecord() { :; }\n'
        + stage
        + "\n}\nstage memcheck '' sh -c 'echo cache=${PYTORCH_NO_CUDA_MEMORY_CACHING:-on}'\n"
        + "stage bench '' sh -c 'echo cache=${PYTORCH_NO_CUDA_MEMORY_CACHING:-on}'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_NO_CUDA_MEMORY_CACHING"}
    subprocess.run(["bash", str(runner), str(tmp_path)], check=True, capture_output=True, env=env, timeout=60)
    assert (tmp_path / "memcheck.log").read_text() == "cache=1\n"
    assert (tmp_path / "bench.log").read_text() == "cache=on\n"
    for tool in SANITIZERS:
        assert re.search(rf'^  "{tool}\|\d+\|sanitizer\|off\|', script, re.MULTILINE), tool
        assert f"--tool {tool}" in script.split(f"\nstage {tool} ", 1)[1].split("\n", 1)[0]


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
