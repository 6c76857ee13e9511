"""The CPU kernel counts a block's exponent histogram two ways: byte compares over the window of bins
between the block's smallest and largest finite nonzero magnitudes (at most 40 bins wide), or one
scattered increment per element for wider blocks. Both must agree with the oracles, at the window's edges,
with zeros, float32 subnormals and non-finite values outside or inside the window."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import amp_inspect
from tests import oracles

BLOCK = 2048  # the CPU kernel's inner block
WINDOW = 40  # kMaxWindowBins in csrc/tensor_stats/tensor_stats_cpu.cpp


def _spanning(width: int, n: int, rng: np.random.Generator, *, base_exponent: int = -20) -> np.ndarray:
    """n float32 values whose binades cover exactly `width` consecutive bins (both ends present)."""
    exponents = rng.integers(base_exponent, base_exponent + width, n)
    exponents[0], exponents[-1] = base_exponent, base_exponent + width - 1
    mantissas = rng.uniform(1.0, 2.0, n)
    signs = rng.choice([-1.0, 1.0], n)
    return (signs * mantissas * np.exp2(exponents.astype(np.float64))).astype(np.float32)


@pytest.mark.parametrize("width", [1, 2, WINDOW - 1, WINDOW, WINDOW + 1, 120])
@pytest.mark.parametrize("extras", ["none", "zeros", "nonfinite", "f32_subnormals", "all"])
@pytest.mark.parametrize("n", [BLOCK, BLOCK - 1, 3 * BLOCK + 17])
def test_window_and_scatter_paths(width: int, extras: str, n: int) -> None:
    rng = np.random.default_rng(width * 1000 + n)
    v = _spanning(width, n, rng)
    positions = rng.choice(n, size=min(9, n), replace=False)
    if extras in ("zeros", "all"):
        v[positions[:3]] = [0.0, -0.0, 0.0]
    if extras in ("nonfinite", "all"):
        v[positions[3:6]] = [np.nan, np.inf, -np.inf]
    if extras in ("f32_subnormals", "all"):
        v[positions[6:9]] = np.array([1e-40, -1e-42, 1e-45], dtype=np.float32)
    t = torch.from_numpy(v)
    stats = amp_inspect.tensor_stats([t], formats=oracles.ALL_FORMATS)
    oracles.assert_stats_match_oracle(stats, [t], None)


@pytest.mark.parametrize("fill", [0.0, float("nan"), float("inf")])
def test_blocks_without_finite_nonzero_values(fill: float) -> None:
    t = torch.full((BLOCK + 5,), fill)
    t[7] = -0.0
    stats = amp_inspect.tensor_stats([t])
    oracles.assert_stats_match_oracle(stats, [t], None)
    assert int(stats.hist[0].sum()) == t.numel()
