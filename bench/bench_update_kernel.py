"""Benchmark of amp_inspect::update_stats's kernels against one read of its inputs and AdamW's own step.

The benchmark's GPT (``models.make_gpt(ModelSpec(), "cpu", 0)``, 76 parameter tensors, 13.8M elements) is given
random gradients and one AdamW step, so every parameter has an ``exp_avg_sq``. Then, in rounds (one call of each
method per round, so that load from other processes touches them alike): ``read`` (``torch._foreach_norm`` of each
of the four lists the op reads: before, after, grads, exp_avg_sq; the roofline proxy), ``update_stats`` (the op
on those lists, as the optimizer hooks call it) and ``adamw_step`` (``optimizer.step()`` on the same parameters);
on CUDA also ``gradscaler_check`` (GradScaler's ``torch._amp_foreach_non_finite_check_and_unscale_`` on the
gradients). Each method's time is the whole call's (host clock; on CUDA the GPU synchronized before and after) and
is divided by the read's of the same round: the ratios printed are the median and the range of those per-round
ratios, beside the min and median milliseconds. On CUDA each method also gets a kernel-only time (the profiler's
summed kernel durations per call, ``kernel_ms``) and its ratio to the read's (``x_read_kernel``).

``--weights bfloat16`` (or ``float16``) runs the same with the model in that dtype (weights, gradients and AdamW's
state). ``--big`` (CUDA only): instead of the GPT, 100 parameters of 10M elements (1B, drawn on the GPU); left
out, saying so, where the GPU lacks the memory.
Run, from the worktree whose ``amp_inspect/_C`` is to be measured (two builds cannot share one process: compare
two runs by their ratios to the read):
    python bench/bench_update_kernel.py [--device cpu|cuda] [--big] [--quick] [--rounds N]
        [--weights float32|bfloat16|float16] [--threads N] [--out DIR]
``--quick``: 2 rounds (a smoke test); with ``--out`` the JSON is update_<device>[_1B]_<weights>[_quick].json there.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import (  # noqa: E402
    SEED,
    device_time,
    gpu_memory_shortfall,
    gradscaler_check,
    has_cuda_or_says_why,
    machine_info,
    print_table,
    time_rounds,
    write_result,
)
from models import ModelSpec, billion_shapes, make_gpt  # noqa: E402

from amp_inspect.core import ops as _ops  # noqa: E402

ROOFLINE = "read"
BIG_SET = "1B"
# The 1B parameters, their gradients, AdamW's two states, the op's copy of the weights before the step, and
# AdamW's foreach temporaries: six times the parameters' bytes, on the safe side.
BIG_SET_MEMORY_FACTOR = 6


def stepped_model(
    dtype: torch.dtype, device: str = "cpu", big: bool = False
) -> tuple[list[torch.nn.Parameter], torch.optim.AdamW]:
    """The GPT's parameters (``big``: the 1B-element set's, drawn on the device) with random gradients, after one
    AdamW step (its state exists)."""
    if big:
        g = torch.Generator(device).manual_seed(SEED)
        params = [
            torch.nn.Parameter(torch.randn(shape, generator=g, device=device).mul_(0.02).to(dtype))
            for shape in billion_shapes()
        ]
        for p in params:
            p.grad = torch.randn(p.shape, generator=g, device=device).to(dtype)
    else:
        model = make_gpt(ModelSpec(), "cpu", 0).to(device=device, dtype=dtype)
        params = [p for p in model.parameters() if p.requires_grad]
        g = torch.Generator().manual_seed(SEED)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(params, lr=1e-3)
    opt.step()
    return params, opt


def methods(
    params: list[torch.nn.Parameter], opt: torch.optim.AdamW, device: str = "cpu"
) -> dict[str, Callable[[], object]]:
    before = [p.detach().clone() for p in params]
    after = [p.detach() for p in params]
    grads = [p.grad for p in params]
    states = [opt.state[p]["exp_avg_sq"] for p in params]
    op = torch.ops.amp_inspect.update_stats
    made: dict[str, Callable[[], object]] = {
        ROOFLINE: lambda: [torch._foreach_norm(x) for x in (before, after, grads, states)],
        "update_stats": lambda: op(before, after, grads, states),
        "adamw_step": opt.step,
    }
    if device == "cuda":  # GradScaler's pass over the same gradients, for scale
        made["gradscaler_check"] = gradscaler_check(grads)  # type: ignore[arg-type]
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--big", action="store_true", help="CUDA: 100 parameters of 10M elements instead of the GPT")
    parser.add_argument("--quick", action="store_true", help="2 rounds: a smoke test")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--weights", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = args.device
    if args.big and device != "cuda":
        parser.error(f"--big: the {BIG_SET}-element set is drawn and measured on the GPU only: add --device cuda")
    if not has_cuda_or_says_why(device):
        sys.exit(2)
    if device not in _ops.OP_KERNELS["update_stats"]:
        sys.exit(f"no compiled update_stats {device} kernel ({_ops.LOAD_ERROR or 'not built'}): nothing to measure")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rounds = 2 if args.quick else args.rounds
    dtype = getattr(torch, args.weights)
    stem = f"update_{device}" + (f"_{BIG_SET}" if args.big else "") + f"_{args.weights}"
    if args.big:
        numel = sum(math.prod(s) for s in billion_shapes())
        why = gpu_memory_shortfall(BIG_SET_MEMORY_FACTOR * numel * torch.empty((), dtype=dtype).element_size())
        if why:
            print(f"left out: {BIG_SET} {args.weights}: {why}")
            if args.out is not None:
                result = {"machine": machine_info(device), "weights": args.weights, "rows": [], "left_out": why}
                write_result(result, args.out, stem, quick=args.quick)
            return
    params, opt = stepped_model(dtype, device, args.big)
    calls = methods(params, opt, device)
    # AdamW's step moves the weights the other methods read; the op's "before" is a copy, so every call still
    # reads the same number of bytes.
    times = time_rounds(calls, device, rounds)
    # Kernel-only (CUDA), apart from the whole-call timing: the profiler slows the host.
    kernel_ms = {m: device_time(fn, rounds).kernel_ms for m, fn in calls.items()} if device == "cuda" else {}
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
                "kernel_ms": kernel_ms.get(m),
                "x_read_kernel": kernel_ms[m] / kernel_ms[ROOFLINE] if kernel_ms else None,
            }
        )
    where = "the CPU" if device == "cpu" else torch.cuda.get_device_name()
    print(
        f"update_stats on {where}: {len(params)} {args.weights} tensors, {numel / 1e6:.1f}M elements, "
        f"{torch.get_num_threads()} threads, {rounds} rounds (ratios: per round, to the read)"
    )
    print_table(
        ["method", "min ms", "median ms", "max ms", "x read (median)", "x read (range)", "kernel ms", "x read kernel"],
        [
            [r["method"], f"{r['min_ms']:.1f}", f"{r['median_ms']:.1f}", f"{r['max_ms']:.1f}",
             f"{r['x_read_median']:.2f}", f"{r['x_read_min']:.2f}-{r['x_read_max']:.2f}",
             "-" if r["kernel_ms"] is None else f"{r['kernel_ms']:.3f}",
             "-" if r["x_read_kernel"] is None else f"{r['x_read_kernel']:.2f}"]
            for r in rows
        ],
    )  # fmt: skip
    if args.out is not None:
        result = {"machine": machine_info(device), "weights": args.weights, "numel": numel, "rows": rows}
        write_result(result, args.out, stem, quick=args.quick)


if __name__ == "__main__":
    main()
