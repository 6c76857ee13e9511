"""sumsq accuracy: the spec allows a relative error of 1e-5 against a float64 sum. The CPU kernel sums
squares in float32 lanes of at most 16 terms (relative error below 16 * 2^-24, about 1e-6) for blocks whose
largest |v| lies in [2^-50, 2^60), and in float64 otherwise; these cases sit on and around those edges."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import amp_inspect

BOUND = 2e-6  # what the kernel guarantees; the spec asks for 1e-5


def _float64_sumsq(t: torch.Tensor) -> float:
    v = t.double().numpy()
    v = v[np.isfinite(v)]
    return float(np.sum(v * v))


def _cases() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    n = 5 * 2048 + 37
    cases = {
        "equal magnitudes (worst accumulation)": torch.full((n,), 1.0 + 2.0**-23),
        "randn": torch.randn(n, generator=g),
        "one large among tiny": torch.cat([torch.tensor([3e4]), torch.rand(n, generator=g) * 1e-20]),
        "huge (float64 path)": torch.randn(n, generator=g) * 1e30,
        "tiny (float64 path)": torch.randn(n, generator=g) * 1e-30,
        "with NaN and Inf": torch.randn(n, generator=g).index_fill_(0, torch.tensor([5, 4000]), float("nan")),
    }
    for label, edge in (("2^-50", 2.0**-50), ("2^60", 2.0**60)):
        for side, factor in (("below", 1 - 2**-20), ("at", 1.0), ("above", 1 + 2**-20)):
            values = torch.rand(n, generator=g) * edge
            values[123] = edge * factor
            cases[f"largest {side} {label}"] = values
    return cases


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sumsq_relative_error(case: str, dtype: torch.dtype) -> None:
    t = _cases()[case].to(dtype)
    want = _float64_sumsq(t)
    got = float(amp_inspect.tensor_stats([t]).sumsq[0])
    if want == 0.0:
        assert got == 0.0
    else:
        assert abs(got - want) <= BOUND * want, f"{case} {dtype}: {got} vs {want}"
