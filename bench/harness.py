"""What every benchmark here shares: the machine description, timing, step records, tables, target checks and
the JSON file of results. The scripts say what they measure; this module says how a measurement is taken
and written down.

- ``time_calls``: milliseconds of each call after untimed warm-up calls (CUDA events on CUDA);
  ``time_rounds``: whole-call milliseconds of several calls taken in rotating rounds (the host clock, the GPU
  synchronized before and after each call); ``device_time``: the kernel-only time of a call and the kernels,
  copies and memsets it puts on the GPU, from the profiler's device events; ``PhaseClock``: marks inside one
  training step.
- ``interleave``: runs several configurations' steps in rounds, the order rotating each round, so that drift
  in machine load touches all of them alike; ``StepMeasurement``: one configuration's step times, medians,
  quartiles and the per-round ratio to a baseline, with ``median_ci``, a distribution-free confidence
  interval of that ratio's median.
- ``TargetCheck`` / ``at_most`` / ``print_checks``: PASS/MISS lines that say what was measured against what.
- ``print_table``: a fixed-width table (amp_inspect.core.table.fixed_width).
- ``machine_info`` / ``write_result``: the JSON file, with the machine, torch, git commit and load average.
- ``fused`` / ``foreach_norm`` / ``gradscaler_check``: the passes over a list of gradients that both
  bench_tensor_stats.py and bench_step.py time (each returns a call ready to time).
- ``training_step``: the mixed-precision step bench_step.py and bench_distributed.py time, written once; each
  Trainer there holds its configuration's model, optimizer, scaler and inspector, and its own clock.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

import amp_inspect
from amp_inspect.core import ops as _ops
from amp_inspect.core.table import fixed_width

SEED = 20240601
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CI_Z = 1.96  # median_ci: ~95%

Runner = TypeVar("Runner")
Record = TypeVar("Record")


# ---------------------------------------------------------------------------------------------- timing


def time_calls(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> list[float]:
    """Milliseconds of each of ``repeats`` calls after ``warmup`` untimed ones. On CUDA, events recorded on
    an idle stream around each call, so the time covers host launch overhead and the kernels."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            torch.cuda.synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def whole_call_ms(fn: Callable[[], object], device: str) -> float:
    """Milliseconds of one call by the host clock; on CUDA the GPU is synchronized before and after, so the time
    covers the host's work, the launches, the kernels and any host sync the call makes."""
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def time_rounds(calls: dict[str, Callable[[], object]], device: str, rounds: int) -> dict[str, list[float]]:
    """Whole-call milliseconds (``whole_call_ms``) of each call, after one untimed call of each: ``rounds`` rounds
    of one call of each, the first of a round rotating, so that load from other processes touches them alike and
    per-round ratios compare calls made side by side."""
    for fn in calls.values():
        fn()
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            times[name].append(whole_call_ms(calls[name], device))
    return times


@dataclass(frozen=True)
class DeviceTime:
    """What ``calls`` profiled calls put on the GPU, in all: kernels, copies and memsets, and the kernels' summed
    durations (kernel-only time: the host's launch overhead and the gaps between kernels left out)."""

    calls: int
    kernels: int
    memcpy: int
    memset: int
    kernel_us: float

    @property
    def kernel_ms(self) -> float:
        """Kernel-only milliseconds per call."""
        return self.kernel_us / self.calls / 1e3


def device_events(events: Sequence[tuple[str, float]], calls: int) -> DeviceTime:
    """``DeviceTime`` from the profiler's device events as (name, microseconds): the copies' and memsets' names
    begin with Memcpy / Memset, every other device event is a kernel."""
    memcpy = sum(name.startswith("Memcpy") for name, _ in events)
    memset = sum(name.startswith("Memset") for name, _ in events)
    kernel_us = sum(us for name, us in events if not name.startswith(("Memcpy", "Memset")))
    return DeviceTime(calls, len(events) - memcpy - memset, memcpy, memset, kernel_us)


def device_time(fn: Callable[[], object], calls: int) -> DeviceTime:
    """Profiles ``calls`` calls of ``fn`` on the GPU (after one untimed call: lazy initialisation is not counted).
    Costs the profiler's overhead on the host, which the kernel-only time does not include."""
    fn()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    on_device = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return device_events([(e.name, e.time_range.elapsed_us()) for e in on_device], calls)


def gpu_memory_shortfall(needed_bytes: int) -> str:
    """Why ``needed_bytes`` of GPU memory cannot be had now (free memory from ``torch.cuda.mem_get_info``), or
    empty when they can: a set too large for this GPU is left out, saying so, instead of failing the run."""
    free, total = torch.cuda.mem_get_info()
    if needed_bytes <= free:
        return ""
    return f"needs {needed_bytes / 2**30:.1f} GiB of GPU memory, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def training_step(
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    loss: Callable[[], torch.Tensor],
    check: Callable[[], object] | None,
    mark: Callable[[], None],
) -> None:
    """One training step: ``opt.zero_grad``, ``scaler.scale(loss()).backward()``, ``check()`` (the inspector's,
    where the configuration checks), ``scaler.step`` and ``update``. ``mark()`` runs before the step and after
    each of its three phases (forward + backward, check, optimizer step), for the caller's clock."""
    mark()
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss()).backward()
    mark()
    if check is not None:
        check()
    mark()
    scaler.step(opt)
    scaler.update()
    mark()


class PhaseClock:
    """Marks points in a step; on CPU with the host clock, on CUDA with events (read after the step)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:], strict=False)
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in pairs]
        return [(b - a) * 1e3 for a, b in pairs]


def interleave(
    runners: Sequence[Runner], step: Callable[[Runner], Record], warmup: int, rounds: int, steps_per_round: int
) -> tuple[list[list[Record]], list[list[list[Record]]]]:
    """``warmup`` steps of every runner, then ``rounds`` rounds in which each takes ``steps_per_round`` steps,
    the starting runner rotating each round. Returns, per runner, its warm-up records and its rounds' records."""
    n = len(runners)
    warm: list[list[Record]] = [[] for _ in runners]
    timed: list[list[list[Record]]] = [[] for _ in runners]
    for _ in range(warmup):
        for i, runner in enumerate(runners):
            warm[i].append(step(runner))
    for r in range(rounds):
        for i in [(r + k) % n for k in range(n)]:
            timed[i].append([step(runners[i]) for _ in range(steps_per_round)])
    return warm, timed


def median_ci(values: Sequence[float], z: float = CI_Z) -> tuple[float, float]:
    """Distribution-free confidence interval of the median: the order statistics (n -+ z * sqrt(n)) / 2
    (~95% for z = 1.96; for few values it widens to the extremes)."""
    ordered = sorted(values)
    k = max(0, math.floor((len(ordered) - z * math.sqrt(len(ordered))) / 2))
    return ordered[k], ordered[len(ordered) - 1 - k]


def paired_ratios(mine: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """Per-round ratios of two configurations' round medians (the rounds ran interleaved)."""
    return [a / b for a, b in zip(mine, theirs, strict=True)]


@dataclass
class StepMeasurement:
    """Step times of one configuration (ms), split into phases: forward + backward, check(), and
    scaler.step + update (where the InspectingGradScaler's unscale pass runs). On CUDA the phases are read
    from CUDA events (device timeline), the step total from the host clock around synchronized ends."""

    config: str
    description: str
    step_ms: list[float]
    fwd_bwd_ms: list[float]
    check_ms: list[float]
    opt_ms: list[float]
    round_medians_ms: list[float]
    median_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    q1_ms: float = 0.0
    q3_ms: float = 0.0
    check_median_ms: float = 0.0
    opt_median_ms: float = 0.0
    x_bare: float | None = None  # median step / bare's median step
    x_bare_paired: float | None = None  # median over rounds of the per-round ratio
    x_bare_paired_min: float | None = None
    x_bare_paired_max: float | None = None
    direct_ms: float | None = None  # check() + scaler.step/update beyond bare's (medians): the inspection's own time

    @property
    def overhead_pct(self) -> float | None:
        return None if self.x_bare_paired is None else (self.x_bare_paired - 1.0) * 100.0

    def __post_init__(self) -> None:
        self.median_ms = statistics.median(self.step_ms)
        self.min_ms = min(self.step_ms)
        self.max_ms = max(self.step_ms)
        if len(self.step_ms) >= 2:
            self.q1_ms, _, self.q3_ms = statistics.quantiles(self.step_ms, n=4)
        else:
            self.q1_ms = self.q3_ms = self.median_ms
        self.check_median_ms = statistics.median(self.check_ms)
        self.opt_median_ms = statistics.median(self.opt_ms)

    def compare(self, bare: StepMeasurement) -> None:
        self.x_bare = self.median_ms / bare.median_ms
        paired = paired_ratios(self.round_medians_ms, bare.round_medians_ms)
        self.x_bare_paired = statistics.median(paired)
        self.x_bare_paired_min = min(paired)
        self.x_bare_paired_max = max(paired)
        self.direct_ms = self.check_median_ms + self.opt_median_ms - bare.check_median_ms - bare.opt_median_ms


# ------------------------------------------------------------------------------- passes over gradients


def fused(formats: Sequence[str] = ("fp16",), scale: float | None = None) -> Callable:
    """amp_inspect.tensor_stats(grads): every statistic in one pass."""

    def prepare(grads: list[torch.Tensor]) -> Callable[[], object]:
        return lambda: amp_inspect.tensor_stats(grads, formats=formats, scale=scale)

    return prepare


def foreach_norm(grads: list[torch.Tensor]) -> Callable[[], object]:
    """torch._foreach_norm: one read of every gradient, the roofline proxy."""
    return lambda: torch._foreach_norm(grads)


def gradscaler_check(grads: list[torch.Tensor]) -> Callable[[], object]:
    """GradScaler's unscale pass; inv_scale 1 leaves the values as they are, so the in-place write does not
    disturb later methods."""
    found_inf = torch.zeros((), device=grads[0].device)
    inv_scale = torch.ones((), device=grads[0].device)
    return lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)


# ---------------------------------------------------------------------------------------------- output


@dataclass
class TargetCheck:
    name: str
    passed: bool
    detail: str


def at_most(name: str, measured: float, limit: float, detail: str = "", unit: str = "x") -> TargetCheck:
    """A target ``measured <= limit``; the line shows both (``unit`` "x": ratios, "%": percentages)."""
    return TargetCheck(name, measured <= limit, _shown(measured, "at most", limit, unit, detail))


def at_least(name: str, measured: float, limit: float, detail: str = "", unit: str = "x") -> TargetCheck:
    """A target ``measured >= limit``, shown as ``at_most``'s."""
    return TargetCheck(name, measured >= limit, _shown(measured, "at least", limit, unit, detail))


def _shown(measured: float, bound: str, limit: float, unit: str, detail: str) -> str:
    text = (
        f"{measured:.3f}x ({bound} {limit:g}x)" if unit == "x" else f"{measured:+.2f}{unit} ({bound} {limit:g}{unit})"
    )
    return text + (f"; {detail}" if detail else "")


def print_checks(checks: Sequence[TargetCheck]) -> None:
    for c in checks:
        print(f"{'PASS' if c.passed else 'MISS'}  {c.name}: {c.detail}")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A fixed-width table: the first column left-aligned, the others right-aligned, cells as ``str``."""
    print("\n".join(fixed_width(headers, [[str(cell) for cell in row] for row in rows])))


def machine_info(device: str) -> dict[str, object]:
    """The machine, the software and the load, for the results file: timings mean little without them."""
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    info: dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "amp_inspect": amp_inspect.__version__,
        "amp_inspect_build": _ops.build_info(),
        "git": commit,
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_average(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def load_average() -> tuple[float, float, float] | None:
    return os.getloadavg() if hasattr(os, "getloadavg") else None


def write_result(result: object, out_dir: Path, stem: str, quick: bool) -> Path:
    """Writes a result (a dataclass or a dict) as JSON to out_dir/<stem>[_quick].json and says where."""
    path = out_dir / f"{stem}{'_quick' if quick else ''}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = asdict(result) if is_dataclass(result) and not isinstance(result, type) else result
    path.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {path}")
    return path


def has_cuda_or_says_why(device: str) -> bool:
    """False, with a sentence, when ``device`` is cuda and torch sees no CUDA GPU."""
    if device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but no CUDA GPU is visible to torch (torch.cuda.is_available() is False)")
        return False
    if not _ops.has_kernel(device):
        # The op would fall back to the reference; say so rather than publish its timings as the kernel's.
        print(f"warning: amp_inspect has no compiled {device} kernel; the inspection runs the reference")
    return True
