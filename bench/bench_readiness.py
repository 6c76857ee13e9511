"""Benchmark of amp_inspect.format_readiness's kernels against one torch read pass (CPU: torch.linalg.vector_norm;
CUDA: torch._foreach_norm, beside GradScaler's torch._amp_foreach_non_finite_check_and_unscale_).

Every method is timed per call, in this one process, on the same tensors, in rounds: one call of each method per
round, so that load from other processes touches them alike, and each method's time is divided by the read pass's
of the same round (the ratios printed are the median and the range of those per-round ratios). The time is the
whole call's (host clock; on CUDA the GPU synchronized before and after); on CUDA each method also gets a
kernel-only time (the profiler's summed kernel durations per call, ``kernel_ms``) and its ratio to the read's
(``x_read_kernel``).

Sets: ``act-4M``, an activation-like [4096, 1024] tensor (normal values, a few rows scaled by powers of two), in
float32 and bfloat16 (on CUDA float16 too); ``gpt2-style``, the 76 weight-shaped tensors of the benchmarks' small GPT
(~14M elements); with ``--big`` (CUDA only) instead ``1B``, 100 tensors of 10M elements drawn on the GPU, in
float32, bfloat16 and float16 (each left out, saying so, where the GPU lacks the memory).
Methods: ``vector_norm`` (CPU) or ``foreach_norm`` (CUDA) (one read: the roofline proxy), on CUDA
``gradscaler_check``, ``tensor_stats`` (the gradient pass's fused op, for
scale), ``all_recipes`` (the 8 recipes, the tensor amax measured
by a first pass), ``all_recipes_delayed`` (the 8, tensor amax given: one pass), ``mxfp8_e4m3`` (one block recipe),
``fp8_tensor_delayed`` (fp8_e4m3_tensor, amax given), and with ``--reference`` the float64 reference; with
``--per-recipe`` also ``no_recipe`` (the unit scan alone: counts, sq_signal, sub-block amaxes) and each recipe alone,
amax given (``<recipe>_delayed``): a recipe's own cost is its time less ``no_recipe``'s.

Run:
    python bench/bench_readiness.py [--device cpu|cuda] [--big] [--quick] [--rounds N] [--reference] [--per-recipe]
        [--out DIR]
Prints the table; with ``--out`` writes readiness_<device>[_1B].json there.
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
    foreach_norm,
    gpu_memory_shortfall,
    gradscaler_check,
    has_cuda_or_says_why,
    machine_info,
    print_table,
    time_rounds,
    write_result,
)
from models import billion_shapes, gpt2_style_shapes  # noqa: E402

import amp_inspect  # noqa: E402
from amp_inspect.core import ops as _ops  # noqa: E402
from amp_inspect.core.recipes import RECIPE_NAMES  # noqa: E402
from amp_inspect.core.references.format_readiness import format_readiness_reference  # noqa: E402

# The read pass every ratio is to: the committed CPU results used vector_norm per tensor; on CUDA the one-launch
# torch._foreach_norm, the same roofline proxy bench_tensor_stats.py uses there.
ROOFLINE = {"cpu": "vector_norm", "cuda": "foreach_norm"}
DTYPE_SUFFIX = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
BIG_SET = "1B"
BIG_SET_MEMORY_FACTOR = 2  # the tensors and one float32 temporary of a tensor's size, on the safe side


def activation_set(dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(4096, 1024, generator=g)
    x[::64] *= 2.0 ** torch.randint(-20, 20, (64, 1), generator=g)
    return [x.to(device=device, dtype=dtype)]


def gpt2_set(dtype: torch.dtype, device: str = "cpu") -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    return [torch.randn(shape, generator=g).to(device=device, dtype=dtype) for shape in gpt2_style_shapes()]


def billion_set(dtype: torch.dtype, device: str) -> list[torch.Tensor]:
    """The 1B-element set, drawn on ``device`` (normal values, as the activation set's unscaled rows)."""
    g = torch.Generator(device).manual_seed(SEED)
    return [torch.randn(shape, generator=g, device=device).to(dtype) for shape in billion_shapes()]


def methods(
    tensors: list[torch.Tensor], reference: bool, per_recipe: bool = False, device: str = "cpu"
) -> dict[str, Callable[[], object]]:
    amax = torch.stack([t.float().abs().amax() for t in tensors])
    all_recipes = list(range(len(RECIPE_NAMES)))
    op = _ops.format_readiness_op
    if device == "cpu":
        read = ROOFLINE[device]
        made: dict[str, Callable[[], object]] = {read: lambda: [torch.linalg.vector_norm(t) for t in tensors]}
    else:
        made = {ROOFLINE[device]: foreach_norm(tensors), "gradscaler_check": gradscaler_check(tensors)}
    made |= {
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
    name: str, tensors: list[torch.Tensor], rounds: int, reference: bool, per_recipe: bool = False, device: str = "cpu"
) -> list[dict]:
    calls = methods(tensors, reference, per_recipe, device)
    times = time_rounds(calls, device, rounds)
    # Kernel-only (CUDA), apart from the whole-call timing: the profiler slows the host.
    kernel_ms = {m: device_time(fn, rounds).kernel_ms for m, fn in calls.items()} if device == "cuda" else {}
    read = ROOFLINE[device]
    numel = sum(t.numel() for t in tensors)
    rows = []
    for m, ms in times.items():
        ratios = [a / b for a, b in zip(ms, times[read], strict=True)]
        rows.append(
            {
                "set": name,
                "method": m,
                "median_ms": statistics.median(ms),
                "ns_per_element": statistics.median(ms) * 1e6 / numel,
                "x_read_median": statistics.median(ratios),
                "x_read_min": min(ratios),
                "x_read_max": max(ratios),
                "kernel_ms": kernel_ms.get(m),
                "x_read_kernel": kernel_ms[m] / kernel_ms[read] if kernel_ms else None,
            }
        )
    return rows


SetMaker = tuple[str, torch.dtype, Callable[[], list[torch.Tensor]]]


def sets_to_run(device: str, quick: bool, big: bool) -> list[SetMaker]:
    """(name, dtype, maker) of each set, made only when its turn comes (the 1B sets one at a time)."""
    if big:
        return [(f"{BIG_SET}-{DTYPE_SUFFIX[d]}", d, lambda d=d: billion_set(d, device)) for d in DTYPE_SUFFIX]
    dtypes = [torch.float32] if quick else [torch.float32, torch.bfloat16]
    if device == "cuda" and not quick:
        dtypes.append(torch.float16)
    made: list[SetMaker] = [(f"act-4M-{DTYPE_SUFFIX[d]}", d, lambda d=d: activation_set(d, device)) for d in dtypes]
    if not quick:
        made.append(("gpt2-style-fp32", torch.float32, lambda: gpt2_set(torch.float32, device)))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--big", action="store_true", help="CUDA: the 1B-element set (fp32, bf16, fp16) only")
    parser.add_argument("--quick", action="store_true", help="3 rounds, the activation set in float32 only")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--reference", action="store_true", help="time the float64 reference too (slow)")
    parser.add_argument("--per-recipe", action="store_true", help="each recipe alone too, and no recipe (the scan)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    device = args.device
    if args.big and device != "cuda":
        parser.error(f"--big: the {BIG_SET}-element set is drawn and measured on the GPU only: add --device cuda")
    if not has_cuda_or_says_why(device):
        sys.exit(2)
    if device not in _ops.OP_KERNELS["format_readiness"]:
        sys.exit(f"no compiled format_readiness {device} kernel ({_ops.LOAD_ERROR or 'not built'}): nothing to measure")
    rounds = 3 if args.quick else args.rounds
    rows: list[dict] = []
    left_out: list[dict[str, str]] = []
    for name, dtype, make in sets_to_run(device, args.quick, args.big):
        if args.big:
            numel = sum(math.prod(s) for s in billion_shapes())
            why = gpu_memory_shortfall(BIG_SET_MEMORY_FACTOR * numel * torch.empty((), dtype=dtype).element_size())
            if why:
                print(f"left out: {name}: {why}")
                left_out.append({"set": name, "why": why})
                continue
        tensors = make()
        rows += run_set(name, tensors, rounds, args.reference, args.per_recipe, device)
        del tensors  # the next 1B set needs the memory
    where = "the CPU" if device == "cpu" else torch.cuda.get_device_name()
    print(f"format_readiness on {where}, {torch.get_num_threads()} threads, {rounds} rounds (ratios: per round)")
    print_table(
        ["set", "method", "median ms", "ns/element", "x read (median)", "x read (range)", "kernel ms", "x read kernel"],
        [
            [r["set"], r["method"], f"{r['median_ms']:.2f}", f"{r['ns_per_element']:.2f}", f"{r['x_read_median']:.1f}",
             f"{r['x_read_min']:.1f}-{r['x_read_max']:.1f}",
             "-" if r["kernel_ms"] is None else f"{r['kernel_ms']:.3f}",
             "-" if r["x_read_kernel"] is None else f"{r['x_read_kernel']:.2f}"]
            for r in rows
        ],
    )  # fmt: skip
    if args.out is not None:
        stem = f"readiness_{device}" + (f"_{BIG_SET}" if args.big else "")
        result = {"machine": machine_info(device), "rows": rows, "left_out": left_out}
        write_result(result, args.out, stem, quick=args.quick)


if __name__ == "__main__":
    main()
