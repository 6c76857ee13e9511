"""check() of two checkouts side by side in one run: the cost a change to the Python layer adds, or not.

    python bench/compare_checkouts.py --before /path/to/old/checkout [--after .] [--rounds 12] [--steps 20]

Each round runs one fresh interpreter per checkout (the order alternates round by round, so a machine that gets
busier or quieter weighs on both alike), each on the same TinyGPT loop (bf16 autocast on the CPU, or fp16 with a
GradScaler on CUDA), timing ``insp.check()`` alone with ``perf_counter`` after a warm-up. Prints the median
check() time of each checkout, the ratio after / before with a 95% interval over the rounds' ratios, and whether
the ratio is within noise (the interval holds 1). Both checkouts must hold a built extension (``make setup``, or
copy ``amp_inspect/_C*.so`` into a worktree of an older commit whose C++ is the same).

With ``--distributed``, each round runs this checkout's ``bench/bench_distributed.py`` (two gloo ranks, DDP and
FSDP2, every configuration interleaved with its bare baseline in one run) once against each checkout's package, and
compares what that run measures side by side: the step of ``ddp_check`` and ``fsdp_check`` over the family's bare
step (the median of per-round ratios), and the time inside the inspection's own parts (the comm hook, reduce_stats).

    python bench/compare_checkouts.py --before /path/to/old/checkout --distributed [--rounds 3] [--bench-rounds 20]
        [--amp-dtype float32]   # no autocast: where the CPU emulates bf16 matmuls
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

# One interpreter's measurement: median check() time over ``steps`` steps after ``warmup``, in microseconds.
CHILD = """
import json, sys, time, torch
import amp_inspect
try:
    from amp_inspect.cli.tiny_gpt import TinyGPT
except ImportError:  # a checkout before the subpackages
    from amp_inspect.tiny_gpt import TinyGPT
device, steps, warmup = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(0)
torch.set_num_threads(1)
model = TinyGPT().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device) if device == "cuda" else None
insp = amp_inspect.attach(model, scaler)
dtype = torch.float16 if device == "cuda" else torch.bfloat16
x = torch.randint(0, 64, (8, 32), device=device)
times = []
for step in range(steps + warmup):
    with torch.autocast(device, dtype=dtype):
        loss = model(x).float().logsumexp(-1).mean()
    (scaler.scale(loss) if scaler else loss).backward()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    insp.check()
    if device == "cuda":
        torch.cuda.synchronize()
    took = time.perf_counter() - start
    if scaler:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    opt.zero_grad(set_to_none=True)
    if step >= warmup:
        times.append(took)
insp.detach()
times.sort()
print(json.dumps({"check_us": 1e6 * times[len(times) // 2], "source": amp_inspect.__file__}))
"""


def measure(tree: Path, device: str, steps: int, warmup: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), device, str(steps), str(warmup)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        timeout=600,
    )
    if result.returncode != 0:
        raise SystemExit(f"{tree}: the measurement failed:\n{result.stderr[-2000:]}")
    out = json.loads(result.stdout.strip().splitlines()[-1])
    if not out["source"].startswith(str(tree.resolve())):
        raise SystemExit(f"{tree}: imported amp_inspect from {out['source']}, not from this checkout")
    return out["check_us"]


# What --distributed reads of each bench_distributed.py run: per configuration, its step over the family's bare step
# (the median of per-round paired ratios) and the medians of the time spent in the comm hook and in reduce_stats.
DIST_CONFIGS = ("ddp_check", "fsdp_check")
DIST_FIELDS = ("x_bare_paired", "check_median_ms", "hook_median_ms", "combine_median_ms")


def measure_distributed(tree: Path, bench_rounds: int, amp_dtype: str) -> dict[str, dict[str, float]]:
    """One run of this checkout's bench_distributed.py against ``tree``'s package: DIST_FIELDS of each of
    DIST_CONFIGS. The benchmark puts the checkout above its own folder first on the path, so its folder is copied
    into ``tree`` for the run (a hidden folder, removed after)."""
    bench = Path(__file__).resolve().parent
    with (
        tempfile.TemporaryDirectory(dir=tree, prefix=".compare_bench_") as folder,
        tempfile.TemporaryDirectory() as out,
    ):
        copy = Path(folder) / "bench"
        shutil.copytree(bench, copy, ignore=shutil.ignore_patterns("results", "__pycache__"))
        probe = f"import sys; sys.path[:0] = [{str(tree)!r}]; import amp_inspect; print(amp_inspect.__file__)"
        source = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
        if not source.startswith(str(tree)):
            raise SystemExit(f"{tree}: amp_inspect is imported from {source.strip()}, not from this checkout")
        # bench_distributed.py puts parent.parent of its own file first: the copy's is ``folder``, so link the
        # package there.
        (Path(folder) / "amp_inspect").symlink_to(tree / "amp_inspect")
        command = [sys.executable, str(copy / "bench_distributed.py"), "--rounds", str(bench_rounds), "--out", out]
        command += ["--configs", *DIST_CONFIGS, "--amp-dtype", amp_dtype]  # with their bare baselines
        result = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        if result.returncode != 0:
            raise SystemExit(f"{tree}: bench_distributed.py failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
        (written,) = Path(out).glob("*.json")
        measurements = json.loads(written.read_text())["measurements"]
    by_config = {m["config"]: m for m in measurements}
    return {c: {f: float(by_config[c][f]) for f in DIST_FIELDS} for c in DIST_CONFIGS}


def compare_distributed(before_tree: Path, after_tree: Path, rounds: int, bench_rounds: int, amp_dtype: str) -> None:
    runs: dict[str, list[dict[str, dict[str, float]]]] = {"before": [], "after": []}
    order = (("before", before_tree), ("after", after_tree))
    for round_ in range(rounds):
        for name, tree in order if round_ % 2 == 0 else order[::-1]:
            runs[name].append(measure_distributed(tree.resolve(), bench_rounds, amp_dtype))
            print(f"round {round_ + 1}/{rounds} {name}: {json.dumps(runs[name][-1])}", flush=True)
    print(
        f"bench_distributed.py --amp-dtype {amp_dtype}, {rounds} runs per checkout x {bench_rounds} rounds, "
        "alternating; medians over runs:"
    )
    print(f"  before: {before_tree}\n  after:  {after_tree}")
    for config in DIST_CONFIGS:
        for field in DIST_FIELDS:
            old = [r[config][field] for r in runs["before"]]
            new = [r[config][field] for r in runs["after"]]
            print(
                f"  {config:18s} {field:18s} before {statistics.median(old):8.3f} ({min(old):.3f}-{max(old):.3f})"
                f"   after {statistics.median(new):8.3f} ({min(new):.3f}-{max(new):.3f})"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--distributed", action="store_true", help="bench_distributed.py per checkout (DDP, FSDP2)")
    parser.add_argument("--bench-rounds", type=int, default=20, help="--distributed: bench_distributed.py's --rounds")
    parser.add_argument(
        "--amp-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="--distributed: bench_distributed.py's --amp-dtype (float32 on a CPU that emulates bf16 matmuls)",
    )
    args = parser.parse_args()
    if args.distributed:
        compare_distributed(args.before.resolve(), args.after.resolve(), args.rounds, args.bench_rounds, args.amp_dtype)
        return
    before, after, ratios = [], [], []
    for round_ in range(args.rounds):
        order = ((before, args.before), (after, args.after))
        for sink, tree in order if round_ % 2 == 0 else order[::-1]:
            sink.append(measure(tree.resolve(), args.device, args.steps, args.warmup))
        ratios.append(after[-1] / before[-1])
    ratios.sort()
    mid = statistics.median(ratios)
    spread = 1.96 * statistics.stdev(ratios) / len(ratios) ** 0.5 if len(ratios) > 1 else float("nan")
    low, high = mid - spread, mid + spread
    print(f"check() on {args.device}, {args.rounds} rounds x {args.steps} steps, median per interpreter:")
    print(f"  before {statistics.median(before):9.1f} us   ({args.before})")
    print(f"  after  {statistics.median(after):9.1f} us   ({args.after})")
    verdict = "within noise" if low <= 1.0 <= high else ("slower" if low > 1.0 else "faster")
    print(f"  after / before: {mid:.3f} (95% interval {low:.3f} .. {high:.3f}): {verdict}")


if __name__ == "__main__":
    main()
