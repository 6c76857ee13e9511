"""A CPU tensor of more than 2**31 elements (64-bit sizes and offsets everywhere). About 4 GiB and tens of
seconds: marked slow, run with ``pytest -m slow``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import amp_inspect
from tests import oracles
from tests.oracles import ALL_FORMATS

N = 2**31 + 5


def planted_values(n: int) -> dict[int, float]:
    """A few known values at positions around the 2**31 boundary and the ends; zeros elsewhere."""
    return {
        0: 1.0,
        12345: 500.0,  # fp8_e4m3 overflow
        2**31 - 2: 3e-6,  # fp16 subnormal, fp8 underflow
        2**31 - 1: 1e-30,  # fp16 and fp8 underflow
        2**31: -float("inf"),
        2**31 + 1: -7e4,  # fp16 and fp8 overflow
        n - 2: 1e5,  # fp16 and fp8 overflow
        n - 1: float("nan"),  # the very last element
    }


def check_planted(stats: amp_inspect.core.TensorStats, n: int, planted: dict[int, float], dtype: torch.dtype) -> None:
    values = torch.tensor(list(planted.values()), dtype=torch.float32).to(dtype)
    exp = oracles.expected_row(oracles.judged_values(values, None), ALL_FORMATS)
    zeros = n - len(planted)
    assert int(stats.numel[0]) == n
    assert int(stats.nan[0]) == 1 and int(stats.posinf[0]) == 0 and int(stats.neginf[0]) == 1
    assert int(stats.zero[0]) == zeros
    for c in oracles.CATEGORIES:
        assert stats.__getattribute__(c)[0].tolist() == exp[c].tolist(), c
    assert stats.overflow[0].tolist() == [2, 0, 3, 2]
    assert stats.underflow[0].tolist() == [1, 0, 2, 2]
    assert stats.subnormal[0].tolist() == [1, 0, 0, 0]
    assert float(stats.amax[0]) == float(exp["amax"])
    assert float(stats.amin_nonzero[0]) == float(exp["amin_nonzero"])
    assert float(stats.sumsq[0]) == pytest.approx(exp["sumsq"], rel=1e-9)
    hist = stats.hist[0].cpu()
    assert int(hist.sum()) == n
    assert int(hist[0]) == zeros
    want_hist = torch.from_numpy(exp["hist"])
    want_hist[0] += zeros
    assert torch.equal(hist, want_hist)


@pytest.mark.slow
def test_more_than_2_31_elements_cpu():
    x = torch.zeros(N, dtype=torch.bfloat16)
    planted = planted_values(N)
    for i, value in planted.items():
        x[i] = value
    stats = amp_inspect.tensor_stats([x], formats=ALL_FORMATS)
    check_planted(stats, N, planted, torch.bfloat16)
    # the same elements seen through a stride-2 view of half the size still count right
    half = amp_inspect.tensor_stats([x[1::2]], formats=("fp16",))
    odd = {i: v for i, v in planted.items() if i % 2 == 1}
    assert int(half.numel[0]) == N // 2
    assert int(half.zero[0]) == N // 2 - len(odd)
    assert int(half.nan[0]) == int(any(np.isnan(v) for v in odd.values()))
