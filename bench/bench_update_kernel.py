"""Benchmark of amp_inspect::update_stats's CPU kernel against one read of its inputs and AdamW's own step.

The benchmark's GPT (``models.make_gpt(ModelSpec(), "cpu", 0)``, 76 parameter tensors, 13.8M elements) is given
random gradients and one AdamW step, so every parameter has an ``exp_avg_sq``. Then, in rounds (one call of each
method per round, so that load from other processes touches them alike): ``read`` (``torch._foreach_norm`` of each
of the four lists the op reads: before, after, grads, exp_avg_sq; the roofline proxy), ``update_stats`` (the op
on those lists, as the optimizer hooks call it) and ``adamw_step`` (``optimizer.step()`` on the same parameters).
Each method's time is divided by the read's of the same round: the ratios printed are the median and the range of
those per-round ratios, beside the min and median milliseconds.

``--weights bfloat16`` runs the same with the model in bfloat16 (weights, gradients and AdamW's state).
Run, from the worktree whose ``amp_inspect/_C`` is to be measured (two builds cannot share one process: compare
two runs by their ratios to the read):
    python bench/bench_update_kernel.py [--quick] [--rounds N] [--weights float32|bfloat16] [--threads N] [--out DIR]
``--quick``: 2 rounds (a smoke test); with ``--out`` the JSON is update_cpu_<weights>[_quick].json there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import SEED, machine_info, print_table, write_result  # noqa: E402
from models import ModelSpec, make_gpt  # noqa: E402

from amp_inspect.core import ops as _ops  # noqa: E402

ROOFLINE = "read"


def stepped_model(dtype: torch.dtype) -> tuple[list[torch.nn.Parameter], torch.optim.AdamW]:
    """The GPT's parameters with random gradients, after one AdamW step (its state exists)."""
    model = make_gpt(ModelSpec(), "cpu", 0).to(dtype)
    params = [p for p in model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(SEED)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g).to(dtype)
    opt = torch.optim.AdamW(params, lr=1e-3)
    opt.step()
    return params, opt


def methods(params: list[torch.nn.Parameter], opt: torch.optim.AdamW) -> dict[str, Callable[[], object]]:
    before = [p.detach().clone() for p in params]
    after = [p.detach() for p in params]
    grads = [p.grad for p in params]
    states = [opt.state[p]["exp_avg_sq"] for p in params]
    op = torch.ops.amp_inspect.update_stats
    return {
        ROOFLINE: lambda: [torch._foreach_norm(x) for x in (before, after, grads, states)],
        "update_stats": lambda: op(before, after, grads, states),
        "adamw_step": opt.step,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds: a smoke test")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--weights", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if "cpu" not in _ops.UPDATE_KERNELS:
        sys.exit(f"no compiled update_stats CPU kernel ({_ops.LOAD_ERROR or 'not built'}): nothing to measure")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rounds = 2 if args.quick else args.rounds
    params, opt = stepped_model(getattr(torch, args.weights))
    calls = methods(params, opt)
    for fn in calls.values():  # warm up
        fn()
    times: dict[str, list[float]] = {m: [] for m in calls}
    for r in range(rounds):
        order = list(calls)[r % len(calls) :] + list(calls)[: r % len(calls)]  # the first of a round rotates
        for m in order:
            t0 = time.perf_counter()
            calls[m]()
            times[m].append((time.perf_counter() - t0) * 1e3)
    numel = sum(p.numel() for p in params)
    rows = []
    for m, ms in times.items():
        ratios = [a / b for a, b in zip(ms, times[ROOFLINE], strict=True)]
        rows.append(
            {
                "method": m,
                "min_ms": min(ms),
                "median_ms": statistics.median(ms),
                "max_ms": max(ms),
                "x_read_median": statistics.median(ratios),
                "x_read_min": min(ratios),
                "x_read_max": max(ratios),
            }
        )
    print(
        f"update_stats on the CPU: {len(params)} {args.weights} tensors, {numel / 1e6:.1f}M elements, "
        f"{torch.get_num_threads()} threads, {rounds} rounds (ratios: per round, to the read)"
    )
    print_table(
        ["method", "min ms", "median ms", "max ms", "x read (median)", "x read (range)"],
        [
            [r["method"], f"{r['min_ms']:.1f}", f"{r['median_ms']:.1f}", f"{r['max_ms']:.1f}",
             f"{r['x_read_median']:.2f}", f"{r['x_read_min']:.2f}-{r['x_read_max']:.2f}"]
            for r in rows
        ],
    )  # fmt: skip
    if args.out is not None:
        result = {"machine": machine_info("cpu"), "weights": args.weights, "numel": numel, "rows": rows}
        write_result(result, args.out, f"update_cpu_{args.weights}", quick=args.quick)


if __name__ == "__main__":
    main()
