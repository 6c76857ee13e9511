"""Benchmark of amp_inspect.tensor_stats against the roofline proxy and the ways users check gradients today.

Every method is timed per call, in this one process, on the same synthetic gradient sets:

- ``gpt2-style``: the 76 gradients of a 6-layer GPT (d_model 384, vocab 8192, context 256), ~14M elements.
- ``300x75M``: 300 gradients, 75M elements in all, sizes spread log-uniformly from a few elements to ~3.5M.
- ``gpt2-style-bf16`` (CPU), ``300x75M-bf16``: the same gradients stored as bfloat16 (half the bytes, same
  work per element); ``-fp16``: as float16 (on CUDA by default, on the CPU with ``--dtype float16``).
- ``1B`` (CUDA only, ``--set 1B``): 100 gradients of 10M elements (4 GB in float32), drawn on the GPU; left out,
  saying so, where the GPU lacks the memory.
- ``1000x20M`` (CUDA only): 1000 gradients, used to show the fused op's kernel launches do not grow with T.
- ``1000-tiny`` (CUDA only): 1000 gradients of 1000 elements: the cost of a call that is mostly overhead.

Methods: the fused op (fp16; all four formats; with scale), torch._foreach_norm (one read pass: the roofline
proxy), GradScaler's non-finite check, the pure-torch reference, and per-tensor checks with one op and one
.item() per statistic. Timings are medians over repeats after warmup; on CUDA, CUDA events around each call.
The fast methods are timed in rounds, one call of each per round, so that load from other processes touches
them alike and their ratios compare calls made side by side; the slow ones follow. On CUDA the fast methods also
get a kernel-only time (the profiler's summed kernel durations per call: ``kernel_ms``, ratio
``x_roofline_kernel``) beside the whole call's.

Run:
    python bench/bench_tensor_stats.py [--device cpu|cuda] [--quick] [--out DIR]
        [--set gpt2-style|300x75M|1B ...] [--dtype float32|bfloat16|float16 ...] [--methods a,b] [--repeats N]
        [--tag NAME]

``--set``, ``--dtype`` and ``--methods`` measure a part (``foreach_norm`` is always timed: every ratio is
to it); a partial run writes JSON only with ``--out``, as a quick run does.

Prints a table and PASS/MISS lines for the targets and writes bench/results/tensor_stats_<device>.json
(a --quick run writes nothing unless --out is given, and then to tensor_stats_<device>_quick.json; ``--tag NAME``
writes tensor_stats_<device>_NAME[_quick].json).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

# Run from a checkout without installing (also through runpy, as `amp-inspect bench` does): the package one
# folder up, harness and models beside this file.
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import (  # noqa: E402
    RESULTS_DIR,
    SEED,
    TargetCheck,
    at_least,
    at_most,
    device_time,
    foreach_norm,
    fused,
    gpu_memory_shortfall,
    gradscaler_check,
    has_cuda_or_says_why,
    load_average,
    machine_info,
    print_checks,
    print_table,
    time_calls,
    write_result,
)
from models import billion_shapes, gpt2_style_shapes  # noqa: E402

import amp_inspect  # noqa: E402
from amp_inspect.cli.baselines import per_tensor_checks  # noqa: E402
from amp_inspect.core.references.tensor_stats import tensor_stats_reference  # noqa: E402

ROOFLINE = "foreach_norm"
PURE_PYTHON = "pure_python"
FUSED = "fused_fp16"

# Targets (the lead's acceptance criteria): fused time relative to one read pass and to per-tensor checks.
CPU_MAX_X_ROOFLINE = 2.5
CPU_MIN_SPEEDUP_VS_PYTHON = 50.0
CUDA_MAX_X_ROOFLINE = 1.2
CUDA_MAX_X_ROOFLINE_4FORMATS = 1.5
CUDA_MAX_X_ROOFLINE_TINY = 2.0
TINY_SET = "1000-tiny"
# CPU, issue 19: the fused fp16 check within 1.2x one read, fp32 and bf16, both timed sets.
CPU_MAX_X_ROOFLINE_ONE_READ = 1.2
SUMSQ_RTOL = 2e-6  # what the kernel guarantees (docs/tensor_stats.md): float32 lanes, float64 across them
BASE_SETS = ("gpt2-style", "300x75M")
BIG_SET = "1B"  # CUDA only, asked for by name
# The 1B set needs its gradients plus the largest temporaries of a method (the reference's per-tensor copies, the
# per-tensor checks' masks): four times the set's bytes, on the safe side.
BIG_SET_MEMORY_FACTOR = 4
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_SUFFIX = {torch.float32: "", torch.bfloat16: "-bf16", torch.float16: "-fp16"}

# fp16 thresholds on |v| as users write them: casts overflow to Inf from the midpoint 65520 between 65504
# and 2**16; 2**-25 (half the smallest subnormal) ties to even, i.e. to zero; the midpoint between the
# largest subnormal and 2**-14 ties to 2**-14, a normal number.


# ---------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class GradSet:
    """A named list of gradient shapes; values are drawn from ``SEED`` so every run sees the same data."""

    name: str
    shapes: tuple[tuple[int, ...], ...]
    timed: bool = True  # False: only used for launch counts
    dtype: torch.dtype = torch.float32
    on_device: bool = False  # drawn on the device it is measured on (too large to draw on the CPU and copy)

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


@dataclass(frozen=True)
class MethodSpec:
    """One way to compute gradient statistics; ``slow`` methods get fewer repeats."""

    name: str
    description: str
    prepare: Callable[[list[torch.Tensor]], Callable[[], object]]
    slow: bool = False


@dataclass(frozen=True)
class BenchConfig:
    device: str
    quick: bool
    out_dir: Path | None
    warmup: int
    repeats: int
    slow_warmup: int
    slow_repeats: int
    sets: tuple[str, ...] = BASE_SETS
    dtypes: tuple[torch.dtype, ...] = (torch.float32,)
    methods: tuple[str, ...] = ()  # empty: every method
    partial: bool = False  # --set, --dtype or --methods: a part of the benchmark
    tag: str = ""  # appended to the JSON file's stem


@dataclass
class Measurement:
    set_name: str
    method: str
    tensors: int
    numel: int
    bytes_read: int
    warmup: int
    times_ms: list[float]
    median_ms: float = 0.0
    min_ms: float = 0.0  # next to the median, a sign of interference from other processes
    gb_per_s: float = 0.0
    x_roofline: float | None = None
    kernel_ms: float | None = None  # CUDA, fast methods: the kernels' summed durations per call (profiler)
    x_roofline_kernel: float | None = None  # kernel_ms / foreach_norm's kernel_ms
    x_fused: float | None = None  # time / fused_fp16's: what the pure-torch fallback costs against the kernel
    speedup_vs_python: float | None = None

    def __post_init__(self) -> None:
        self.median_ms = statistics.median(self.times_ms)
        self.min_ms = min(self.times_ms)
        self.gb_per_s = self.bytes_read / (self.median_ms * 1e-3) / 1e9


@dataclass
class LaunchCount:
    set_name: str
    method: str
    tensors: int
    kernels: int
    memcpy: int
    memset: int


@dataclass
class LeftOut:
    set_name: str
    why: str


@dataclass
class BenchResult:
    machine: dict[str, object]
    config: dict[str, object]
    sets: list[dict[str, object]] = field(default_factory=list)
    measurements: list[Measurement] = field(default_factory=list)
    launches: list[LaunchCount] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    agreement: list[TargetCheck] = field(default_factory=list)
    targets: list[TargetCheck] = field(default_factory=list)


# --------------------------------------------------------------------------------------- gradient sets


def spread_sizes(count: int, total: int, decades: float, seed: int) -> tuple[tuple[int, ...], ...]:
    """``count`` 1-D sizes summing to ``total``, log-uniform over ``decades`` decades: a few tensors of a
    handful of elements, most in the thousands to hundreds of thousands, a few of millions."""
    g = torch.Generator().manual_seed(seed)
    weights = (10.0 ** (torch.rand(count, generator=g, dtype=torch.float64) * decades)).tolist()
    scale = total / sum(weights)
    sizes = [max(1, round(w * scale)) for w in weights]
    sizes[max(range(count), key=sizes.__getitem__)] += total - sum(sizes)  # exact total, on the largest
    return tuple((s,) for s in sizes)


def grad_sets(config: BenchConfig) -> list[GradSet]:
    shapes = {
        "gpt2-style": gpt2_style_shapes(),
        "300x75M": spread_sizes(300, 75_000_000, decades=6.0, seed=SEED + 1),
        BIG_SET: billion_shapes(),
    }
    sets = [
        GradSet(name + DTYPE_SUFFIX[dtype], shapes[name], dtype=dtype, on_device=name == BIG_SET)
        for dtype in config.dtypes
        for name in config.sets
    ]
    if config.device == "cuda" and not config.partial:
        # Many small tensors: the case where per-tensor launches would show; counted, not timed.
        sets.append(GradSet("1000x20M", spread_sizes(1000, 20_000_000, decades=5.0, seed=SEED + 2), timed=False))
        if not config.quick:
            sets.append(GradSet(TINY_SET, ((1000,),) * 1000))
    return sets


def make_gradients(grad_set: GradSet, device: str) -> list[torch.Tensor]:
    """float32 "gradients": randn times a per-tensor magnitude 10**U(-6, -2), so the small tensors reach
    fp16's subnormal and underflow ranges, plus ~0.1% exact zeros (dead units, masked positions).
    Drawn on the CPU from one seed, then moved, so CPU and CUDA runs measure the same values; a set drawn
    ``on_device`` is drawn there from the same seed (the same distribution, other values)."""
    drawn_on = device if grad_set.on_device else "cpu"
    g = torch.Generator(drawn_on).manual_seed(SEED)
    grads = []
    for shape in grad_set.shapes:
        magnitude = 10.0 ** (torch.rand((), generator=g, device=drawn_on).item() * 4.0 - 6.0)
        t = torch.randn(shape, generator=g, device=drawn_on) * magnitude
        flat = t.view(-1)
        zeros = max(1, flat.numel() // 1000)
        flat[torch.randint(flat.numel(), (zeros,), generator=g, device=drawn_on)] = 0.0
        grads.append(t.to(device=device, dtype=grad_set.dtype))
    return grads


# --------------------------------------------------------------------------------------------- methods


def reference(grads: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: tensor_stats_reference(grads, None, None, ["fp16"])


def pure_python(grads: list[torch.Tensor]) -> Callable[[], object]:
    return lambda: per_tensor_checks(grads)


METHODS: tuple[MethodSpec, ...] = (
    MethodSpec(FUSED, "amp_inspect.tensor_stats(grads)", fused()),
    MethodSpec(
        "fused_4formats", "tensor_stats, formats fp16, bf16, fp8_e4m3, fp8_e5m2", fused(amp_inspect.core.FORMATS)
    ),
    MethodSpec("fused_scaled", "tensor_stats(grads, scale=65536.0)", fused(scale=65536.0)),
    MethodSpec(ROOFLINE, "torch._foreach_norm(grads): one read pass, the roofline proxy", foreach_norm),
    MethodSpec("gradscaler_check", "torch._amp_foreach_non_finite_check_and_unscale_", gradscaler_check),
    MethodSpec("reference", "the pure-torch fallback, reference.tensor_stats_reference", reference, slow=True),
    MethodSpec(PURE_PYTHON, "per tensor: 10 statistics, one op + .item() each", pure_python, slow=True),
)


# ---------------------------------------------------------------------------------------------- timing


def count_launches(fn: Callable[[], object]) -> tuple[int, int, int]:
    """(kernels, memcpys, memsets) one call puts on the GPU, from the profiler's device events."""
    one = device_time(fn, calls=1)
    return one.kernels, one.memcpy, one.memset


# ---------------------------------------------------------------------------------------------- checks


def check_agreement(set_name: str, grads: list[torch.Tensor]) -> TargetCheck:
    """Fused totals must equal the per-tensor checks', so the benchmark times calls that compute the same."""
    stats = amp_inspect.tensor_stats(grads)
    rows = per_tensor_checks(grads)
    mine = [
        int(stats.nan.sum()),
        int(stats.posinf.sum()),
        int(stats.neginf.sum()),
        int(stats.zero.sum()),
        int(stats.overflow[:, 0].sum()),
        int(stats.underflow[:, 0].sum()),
        int(stats.subnormal[:, 0].sum()),
    ]
    theirs = [int(sum(r[k] for r in rows)) for k in range(7)]
    amax_ok = float(stats.amax.max()) == max(r[7] for r in rows)
    amin_ok = float(stats.amin_nonzero.min()) == min(r[8] for r in rows)
    sumsq = float(stats.sumsq.sum())
    sumsq_ok = math.isclose(sumsq, sum(r[9] for r in rows), rel_tol=SUMSQ_RTOL)
    passed = mine == theirs and amax_ok and amin_ok and sumsq_ok
    detail = (
        f"nan, +inf, -inf, zero, fp16 overflow/underflow/subnormal = {mine} (per-tensor checks: {theirs}); "
        f"amax {'equal' if amax_ok else 'DIFFERS'}, min nonzero {'equal' if amin_ok else 'DIFFERS'}, "
        f"sumsq {'close' if sumsq_ok else 'DIFFERS'}"
    )
    return TargetCheck(f"{set_name}: fused agrees with per-tensor checks", passed, detail)


def check_targets(device: str, result: BenchResult) -> list[TargetCheck]:
    checks = []
    for m in (m for m in result.measurements if m.method == FUSED):
        assert m.x_roofline is not None
        if device == "cpu":
            checks.append(at_most(f"{m.set_name}: fused vs foreach_norm", m.x_roofline, CPU_MAX_X_ROOFLINE))
            name = f"{m.set_name}: fused vs foreach_norm, one-read target"
            checks.append(at_most(name, m.x_roofline, CPU_MAX_X_ROOFLINE_ONE_READ))
            if m.speedup_vs_python is not None:
                name = f"{m.set_name}: speedup vs pure-Python"
                checks.append(at_least(name, m.speedup_vs_python, CPU_MIN_SPEEDUP_VS_PYTHON))
        else:
            limit = CUDA_MAX_X_ROOFLINE_TINY if m.set_name == TINY_SET else CUDA_MAX_X_ROOFLINE
            checks.append(at_most(f"{m.set_name}: fused vs foreach_norm", m.x_roofline, limit))
    if device == "cuda":
        for m in result.measurements:
            if m.method == "fused_4formats" and m.set_name != TINY_SET and m.x_roofline is not None:
                name = f"{m.set_name}: fused, 4 formats vs foreach_norm"
                checks.append(at_most(name, m.x_roofline, CUDA_MAX_X_ROOFLINE_4FORMATS))
    fused_launches = [c for c in result.launches if c.method == FUSED]
    if fused_launches:
        kernels = {c.kernels for c in fused_launches}
        detail = ", ".join(f"{c.tensors} tensors: {c.kernels} kernels" for c in fused_launches)
        checks.append(TargetCheck("fused kernel launches independent of tensor count", len(kernels) == 1, detail))
    return checks


# ----------------------------------------------------------------------------------------------- runs


def measure_set(grad_set: GradSet, config: BenchConfig, result: BenchResult) -> None:
    if grad_set.on_device:
        element_size = torch.empty((), dtype=grad_set.dtype).element_size()
        why = gpu_memory_shortfall(BIG_SET_MEMORY_FACTOR * grad_set.numel * element_size)
        if why:
            print(f"# {grad_set.name}: left out, {why}", flush=True)
            result.left_out.append(LeftOut(grad_set.name, why))
            return
    grads = make_gradients(grad_set, config.device)
    bytes_read = sum(g.numel() * g.element_size() for g in grads)
    result.sets.append({"name": grad_set.name, "tensors": len(grads), "numel": grad_set.numel, "bytes": bytes_read})
    size = f"{len(grads)} tensors, {grad_set.numel:,} elements, {bytes_read / 1e6:.1f} MB"
    print(f"# {grad_set.name}: {size}", flush=True)

    if config.device == "cuda":
        for name, prepare in ((FUSED, fused()), (ROOFLINE, foreach_norm)):
            kernels, memcpy, memset = count_launches(prepare(grads))
            result.launches.append(LaunchCount(grad_set.name, name, len(grads), kernels, memcpy, memset))
    if not grad_set.timed:
        return

    result.agreement.append(check_agreement(grad_set.name, grads))
    specs = [s for s in METHODS if not config.methods or s.name in config.methods or s.name == ROOFLINE]
    fast = [s for s in specs if not s.slow]
    calls = [s.prepare(grads) for s in fast]
    for call in calls:
        time_calls(call, config.device, config.warmup, 0)
    times: list[list[float]] = [[] for _ in fast]
    for r in range(config.repeats):  # one call of each per round, the first rotating
        for i in [(r + k) % len(fast) for k in range(len(fast))]:
            times[i] += time_calls(calls[i], config.device, 0, 1)
    rows = [
        Measurement(grad_set.name, s.name, len(grads), grad_set.numel, bytes_read, config.warmup, t)
        for s, t in zip(fast, times, strict=True)
    ]
    for spec in (s for s in specs if s.slow):
        t = time_calls(spec.prepare(grads), config.device, config.slow_warmup, config.slow_repeats)
        rows.append(
            Measurement(grad_set.name, spec.name, len(grads), grad_set.numel, bytes_read, config.slow_warmup, t)
        )
    if config.device == "cuda":  # kernel-only, apart from the timing above (the profiler slows the host)
        for m, call in zip(rows[: len(fast)], calls, strict=True):
            m.kernel_ms = device_time(call, config.repeats).kernel_ms
    by_name = {m.method: m for m in rows}
    for m in rows:
        m.x_roofline = m.median_ms / by_name[ROOFLINE].median_ms
        if m.kernel_ms is not None:
            m.x_roofline_kernel = m.kernel_ms / by_name[ROOFLINE].kernel_ms
        m.x_fused = m.median_ms / by_name[FUSED].median_ms if FUSED in by_name else None
        m.speedup_vs_python = by_name[PURE_PYTHON].median_ms / m.median_ms if PURE_PYTHON in by_name else None
    result.measurements += rows


def print_results(result: BenchResult) -> None:
    headers = ["set", "method", "ms (median)", "ms (min)", "GB/s", "x roofline", "kernel ms", "x roofline kernel"]
    headers += ["x fused", "speedup vs py"]
    rows = [
        [m.set_name, m.method, f"{m.median_ms:.3f}", f"{m.min_ms:.3f}", f"{m.gb_per_s:.2f}", f"{m.x_roofline:.2f}"]
        + ["-" if m.kernel_ms is None else f"{m.kernel_ms:.3f}"]
        + ["-" if m.x_roofline_kernel is None else f"{m.x_roofline_kernel:.2f}"]
        + ["-" if m.x_fused is None else f"{m.x_fused:.2f}"]
        + ["-" if m.speedup_vs_python is None else f"{m.speedup_vs_python:.1f}"]
        for m in result.measurements
    ]
    print_table(headers, rows)
    if result.launches:
        print()
        rows = [[c.set_name, c.method, c.tensors, c.kernels, c.memcpy, c.memset] for c in result.launches]
        print_table(["set", "method", "tensors", "kernels", "memcpy", "memset"], rows)
    for left in result.left_out:
        print(f"left out: {left.set_name}: {left.why}")


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke test: gpt2-style set only, few repeats")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON folder (default {RESULTS_DIR}; quick: none)")
    parser.add_argument("--set", action="append", choices=(*BASE_SETS, BIG_SET), help="only this set (repeatable)")
    parser.add_argument("--dtype", action="append", choices=tuple(DTYPES), help="only this dtype (repeatable)")
    parser.add_argument("--methods", default="", help="comma-separated methods to time (foreach_norm always is)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, here 2)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds (default 20; quick: 5)")
    parser.add_argument("--tag", default="", help="appended to the JSON file's stem: tensor_stats_<device>_TAG")
    args = parser.parse_args(argv)
    if args.set and BIG_SET in args.set and args.device != "cuda":
        parser.error(f"--set {BIG_SET} is drawn and measured on the GPU only: add --device cuda")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = sorted(set(methods) - {s.name for s in METHODS})
    if unknown:
        parser.error(f"unknown methods {unknown}; choose from {[s.name for s in METHODS]}")
    partial = bool(args.set or args.dtype or methods or args.threads is not None)
    sets = tuple(args.set) if args.set else (BASE_SETS[:1] if args.quick else BASE_SETS)
    if args.dtype:
        dtypes = tuple(DTYPES[d] for d in args.dtype)
    elif args.quick:
        dtypes = (torch.float32,)
    elif args.device == "cuda":  # the targets' dtypes, fp32 and bf16, and fp16 beside them
        dtypes = (torch.float32, torch.bfloat16, torch.float16)
    else:  # fp32 and bf16, the targets' dtypes
        dtypes = (torch.float32, torch.bfloat16)
    out_dir = args.out if args.out is not None or args.quick or partial else RESULTS_DIR
    quick = args.quick or partial
    if args.quick:
        timing = {"warmup": 1, "repeats": 5, "slow_warmup": 0, "slow_repeats": 1}
    else:
        timing = {"warmup": 3, "repeats": 20, "slow_warmup": 1, "slow_repeats": 3}
    if args.repeats is not None:
        timing["repeats"] = args.repeats
    return BenchConfig(
        args.device, quick, out_dir, **timing, sets=sets, dtypes=dtypes, methods=methods, partial=partial, tag=args.tag
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    if not has_cuda_or_says_why(config.device):
        return 2
    torch.manual_seed(SEED)

    result = BenchResult(machine_info(config.device), {k: str(v) for k, v in asdict(config).items()})
    for grad_set in grad_sets(config):
        measure_set(grad_set, config, result)
    result.targets = check_targets(config.device, result)
    # Load during the run, beside the load before it: high values mean the timings shared the CPUs.
    result.machine["load_average_after"] = load_average()

    print()
    print_results(result)
    print()
    print_checks(result.agreement + result.targets)
    if config.out_dir is not None:
        stem = f"tensor_stats_{config.device}" + (f"_{config.tag}" if config.tag else "")
        write_result(result, config.out_dir, stem, config.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
