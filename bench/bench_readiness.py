"""Benchmark of amp_inspect.format_readiness's CPU kernel against one torch read pass (torch.linalg.vector_norm).

Every method is timed per call, in this one process, on the same tensors, in rounds: one call of each method per
round, so that load from other processes touches them alike, and each method's time is divided by the read pass's
of the same round (the ratios printed are the median and the range of those per-round ratios).

Sets: ``act-4M``, an activation-like [4096, 1024] tensor (normal values, a few rows scaled by powers of two), in
float32 and bfloat16; ``gpt2-style``, the 76 weight-shaped tensors of the benchmarks' small GPT (~14M elements).
Methods: ``vector_norm`` (one read: the roofline proxy), ``tensor_stats`` (the gradient pass's fused op, for
scale), ``all_recipes`` (the 8 recipes, the tensor amax measured
by a first pass), ``all_recipes_delayed`` (the 8, tensor amax given: one pass), ``mxfp8_e4m3`` (one block recipe),
``fp8_tensor_delayed`` (fp8_e4m3_tensor, amax given), and with ``--reference`` the float64 reference; with
``--per-recipe`` also ``no_recipe`` (the unit scan alone: counts, sq_signal, sub-block amaxes) and each recipe alone,
amax given (``<recipe>_delayed``): a recipe's own cost is its time less ``no_recipe``'s.

Run:
    python bench/bench_readiness.py [--quick] [--rounds N] [--reference] [--per-recipe] [--out DIR]
Prints the table; with ``--out`` writes readiness_cpu.json there.
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
from models import gpt2_style_shapes  # noqa: E402

import amp_inspect  # noqa: E402
from amp_inspect.core import ops as _ops  # noqa: E402
from amp_inspect.core.recipes import RECIPE_NAMES  # noqa: E402
from amp_inspect.core.references.format_readiness import format_readiness_reference  # noqa: E402

ROOFLINE = "vector_norm"


def activation_set(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(4096, 1024, generator=g)
    x[::64] *= 2.0 ** torch.randint(-20, 20, (64, 1), generator=g)
    return [x.to(dtype)]


def gpt2_set(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(shape, generator=g).to(dtype) for shape in gpt2_style_shapes()]


def methods(tensors: list[torch.Tensor], reference: bool, per_recipe: bool = False) -> dict[str, Callable[[], object]]:
    amax = torch.stack([t.float().abs().amax() for t in tensors])
    all_recipes = list(range(len(RECIPE_NAMES)))
    op = _ops.format_readiness_op
    made: dict[str, Callable[[], object]] = {
        ROOFLINE: lambda: [torch.linalg.vector_norm(t) for t in tensors],
        "tensor_stats": lambda: amp_inspect.tensor_stats(tensors),  # the gradient pass's op, for scale
        "all_recipes": lambda: op(tensors, all_recipes, None),
        "all_recipes_delayed": lambda: op(tensors, all_recipes, amax),
        "mxfp8_e4m3": lambda: op(tensors, [RECIPE_NAMES.index("mxfp8_e4m3")], None),
        "fp8_tensor_delayed": lambda: op(tensors, [RECIPE_NAMES.index("fp8_e4m3_tensor")], amax),
    }
    if per_recipe:
        made["no_recipe"] = lambda: op(tensors, [], amax)
        for index, name in enumerate(RECIPE_NAMES):
            made[f"{name}_delayed"] = lambda index=index: op(tensors, [index], amax)
    if reference:
        made["reference"] = lambda: format_readiness_reference(tensors, all_recipes, None)
    return made


def run_set(
    name: str, tensors: list[torch.Tensor], rounds: int, reference: bool, per_recipe: bool = False
) -> list[dict]:
    calls = methods(tensors, reference, per_recipe)
    for fn in calls.values():  # warm up
        fn()
    times: dict[str, list[float]] = {m: [] for m in calls}
    for _ in range(rounds):
        for m, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            times[m].append((time.perf_counter() - t0) * 1e3)
    numel = sum(t.numel() for t in tensors)
    rows = []
    for m, ms in times.items():
        ratios = [a / b for a, b in zip(ms, times[ROOFLINE], strict=True)]
        rows.append(
            {
                "set": name,
                "method": m,
                "median_ms": statistics.median(ms),
                "ns_per_element": statistics.median(ms) * 1e6 / numel,
                "x_read_median": statistics.median(ratios),
                "x_read_min": min(ratios),
                "x_read_max": max(ratios),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, the activation set in float32 only")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reference", action="store_true", help="time the float64 reference too (slow)")
    parser.add_argument("--per-recipe", action="store_true", help="each recipe alone too, and no recipe (the scan)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if "cpu" not in _ops.READINESS_KERNELS:
        sys.exit(f"no compiled format_readiness CPU kernel ({_ops.LOAD_ERROR or 'not built'}): nothing to measure")
    sets = [("act-4M-fp32", activation_set(torch.float32))]
    if not args.quick:
        sets += [("act-4M-bf16", activation_set(torch.bfloat16)), ("gpt2-style-fp32", gpt2_set(torch.float32))]
    rounds = 3 if args.quick else args.rounds
    rows = [row for name, tensors in sets for row in run_set(name, tensors, rounds, args.reference, args.per_recipe)]
    print(f"format_readiness on the CPU, {torch.get_num_threads()} threads, {rounds} rounds (ratios: per round)")
    print_table(
        ["set", "method", "median ms", "ns/element", "x read (median)", "x read (range)"],
        [
            [r["set"], r["method"], f"{r['median_ms']:.2f}", f"{r['ns_per_element']:.2f}", f"{r['x_read_median']:.1f}",
             f"{r['x_read_min']:.1f}-{r['x_read_max']:.1f}"]
            for r in rows
        ],
    )  # fmt: skip
    if args.out is not None:
        write_result({"machine": machine_info("cpu"), "rows": rows}, args.out, "readiness_cpu", quick=args.quick)


if __name__ == "__main__":
    main()
