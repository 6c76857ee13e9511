"""The gradient checks people write today, kept as the baseline the demo and the benchmark compare with.

Per tensor, one op and one ``.item()`` per statistic (on CUDA each ``.item()`` is a host sync): NaN, +Inf,
-Inf and zero counts, fp16 overflow / underflow / subnormal counts with the exact cast boundaries, max |g|
and min nonzero |g| over finite values, and the sum of squares.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import torch

from amp_inspect.core.torch_compat import foreach_norm

FP16_OVERFLOW_FROM = 65520.0  # |v| >= this casts to Inf (65504 < v < 65520 rounds down to 65504)
FP16_ZERO_UPTO = 2.0**-25  # |v| <= this casts to zero
FP16_NORMAL_FROM = 2.0**-14 - 2.0**-25  # |v| below this (and above FP16_ZERO_UPTO) casts to a subnormal


def per_tensor_checks(grads: Sequence[torch.Tensor]) -> list[tuple[float, ...]]:
    """(nan, +inf, -inf, zero, fp16 overflow, fp16 underflow, fp16 subnormal, max |g|, min nonzero |g|,
    sum of squares) per tensor, the slow way."""
    rows = []
    for g in grads:
        a = g.abs()
        finite = torch.isfinite(g)
        rows.append(
            (
                torch.isnan(g).sum().item(),
                (g == math.inf).sum().item(),
                (g == -math.inf).sum().item(),
                (g == 0).sum().item(),
                (finite & (a >= FP16_OVERFLOW_FROM)).sum().item(),
                ((a > 0) & (a <= FP16_ZERO_UPTO)).sum().item(),
                ((a > FP16_ZERO_UPTO) & (a < FP16_NORMAL_FROM)).sum().item(),
                a[finite].max().item() if g.numel() else 0.0,
                a[finite & (a > 0)].min().item() if bool((a > 0).any()) else math.inf,
                g[finite].double().pow(2).sum().item(),
            )
        )
    return rows


def median_ms(fn: Callable[[], object], device: torch.device, repeats: int = 5) -> float:
    """Median wall time of ``fn`` in ms (after one warm-up call), synchronising CUDA around each call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[repeats // 2] * 1e3


def compare(grads: Sequence[torch.Tensor], repeats: int = 5) -> dict[str, float]:
    """Median ms of one fused tensor_stats pass, of torch._foreach_norm (one read of the gradients: the
    roofline) and of the per-tensor Python checks, on the same gradients."""
    from amp_inspect.core.tensor_stats import tensor_stats

    grads = list(grads)
    device = grads[0].device
    return {
        "fused": median_ms(lambda: tensor_stats(grads), device, repeats),
        "foreach_norm": median_ms(lambda: foreach_norm(grads), device, repeats),
        "per_tensor_python": median_ms(lambda: per_tensor_checks(grads), device, max(1, repeats // 2)),
    }
