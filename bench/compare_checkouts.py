"""check() of two checkouts side by side in one run: the cost a change to the Python layer adds, or not.

    python bench/compare_checkouts.py --before /path/to/old/checkout [--after .] [--rounds 12] [--steps 20]

Each round runs one fresh interpreter per checkout (the order alternates round by round, so a machine that gets
busier or quieter weighs on both alike), each on the same TinyGPT loop (bf16 autocast on the CPU, or fp16 with a
GradScaler on CUDA), timing ``insp.check()`` alone with ``perf_counter`` after a warm-up. Prints the median
check() time of each checkout, the ratio after / before with a 95% interval over the rounds' ratios, and whether
the ratio is within noise (the interval holds 1). Both checkouts must hold a built extension (``make setup``, or
copy ``amp_inspect/_C*.so`` into a worktree of an older commit whose C++ is the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
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
