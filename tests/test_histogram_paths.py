"""The CPU kernel counts a block's exponent histogram three ways: over the window of bins between the block's
smallest and largest finite nonzero magnitudes, bit-sliced (at most 31 bins wide, on AVX-512 CPUs with GFNI, VBMI
and VPOPCNTDQ) or by byte compares (at most 40 bins wide), or one scattered increment per element for wider blocks.
All must agree with the oracles, at the window's edges, with zeros, float32 subnormals and non-finite values
outside or inside the window. The block loops come in two vector widths (32-byte lanes on AVX2 CPUs, 64-byte on
the others): both must give the same statistics."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import amp_inspect
from amp_inspect.core import ops
from tests import oracles

BLOCK = 2048  # the CPU kernel's inner block
WINDOW = 40  # kMaxWindowBins in csrc/tensor_stats/tensor_stats_cpu.cpp
SLICED = 31  # kSlicedBins there: the widest window counted bit-sliced
GROUP = 4  # kBinsPerGroup there: the bit-sliced window counts bins four at a time


def _spanning(width: int, n: int, rng: np.random.Generator, *, base_exponent: int = -20) -> np.ndarray:
    """n float32 values whose binades cover exactly `width` consecutive bins (both ends present)."""
    exponents = rng.integers(base_exponent, base_exponent + width, n)
    exponents[0], exponents[-1] = base_exponent, base_exponent + width - 1
    mantissas = rng.uniform(1.0, 2.0, n)
    signs = rng.choice([-1.0, 1.0], n)
    return (signs * mantissas * np.exp2(exponents.astype(np.float64))).astype(np.float32)


@pytest.mark.parametrize(
    "width", [1, 2, GROUP, GROUP + 1, SLICED - 1, SLICED, SLICED + 1, WINDOW - 1, WINDOW, WINDOW + 1, 120]
)
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


CLONES_ONLY = """
import sys, torch
from amp_inspect.core import ops
assert ops.extension_loaded()
calls = torch.load(sys.argv[1])
op = torch.ops.amp_inspect.tensor_stats.default
torch.save([op(*call) for call in calls], sys.argv[2])
"""
FORMAT_SETS = [["fp16"], ["bf16", "fp8_e4m3"], ["fp16", "bf16", "fp8_e5m2"], ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]]
# Each width's float32 lanes sum at most 16 squares before float64 (tensor_stats_cpu.cpp): each sum is within
# 16 * 2^-24 of the exact one, so two widths' sums within twice that.
SUMSQ_RTOL = 2 * 16 * 2.0**-24


def _width_cases() -> list[torch.Tensor]:
    rng = np.random.default_rng(64)
    values = []
    for width in (1, GROUP + 1, 17, SLICED, SLICED + 1, WINDOW, WINDOW + 1, 120):
        for n in (BLOCK, BLOCK - 1, 3 * BLOCK + 17, 33):
            v = _spanning(width, n, rng, base_exponent=int(rng.integers(-140, 128 - width)))
            values.append(v)
            holed = v.copy()
            holed[rng.choice(n, size=min(6, n), replace=False)] = [0.0, -0.0, np.nan, np.inf, -np.inf, 1e-41][
                : min(6, n)
            ]
            values.append(holed)
    bits = rng.integers(0, 2**32, 5 * BLOCK + 3, dtype=np.uint64).astype(np.uint32).view(np.float32)
    values.append(bits)
    tensors = [torch.from_numpy(v.copy()) for v in values]
    tensors += [t.bfloat16() for t in tensors] + [t.half() for t in tensors]
    g = torch.Generator().manual_seed(64)
    for length in (1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 129):
        tensors.append(torch.randn(length, generator=g) * 10.0 ** torch.empty(length).uniform_(-9, 4, generator=g))
        tensors.append(tensors[-1].bfloat16())
    return tensors


def _run_with(variable: str, calls_file, out_file) -> list:
    env = {**os.environ, variable: "1"}
    command = [sys.executable, "-c", CLONES_ONLY, str(calls_file), str(out_file)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return torch.load(out_file)


def _calls(tmp_path) -> list:
    tensors = _width_cases()
    calls = [(tensors, None, None, formats) for formats in FORMAT_SETS]
    calls.append((tensors, torch.tensor(1024.0), None, ["fp16", "bf16"]))
    calls.append((tensors, None, 2.0**-7, ["fp8_e4m3"]))
    torch.save(calls, tmp_path / "calls.pt")
    return calls


def _assert_same_statistics(calls: list, reference: list, *others: list) -> None:
    """Counts, histograms and extremes the same bits; sums of squares within the kernel's bound."""
    for call, mine, *theirs in zip(calls, reference, *others, strict=True):
        for got in theirs:
            *exact, sumsq = mine
            *exact_there, sumsq_there = got
            for name, a, b in zip(("counts", "hist", "amax", "amin_nonzero"), exact, exact_there, strict=True):
                assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), (name, call[3])
            torch.testing.assert_close(sumsq, sumsq_there, rtol=SUMSQ_RTOL, atol=0.0)


def test_the_avx2_lanes_and_the_cloned_loops_give_the_same_statistics(tmp_path) -> None:
    """The block loops run with 32-byte lanes on a CPU with AVX2 and FMA but not AVX-512 (count_block_avx2), and
    with 64-byte lanes in the cloned loops elsewhere, so one machine would test one width alone: two processes run
    the same calls, one with the cloned loops forced (AMP_INSPECT_TEST_TENSOR_STATS_CLONES), one with the 32-byte
    lanes forced where the CPU has AVX2 (AMP_INSPECT_TEST_TENSOR_STATS_AVX2; both read by tensor_stats_cpu.cpp).
    Counts, histograms and extremes are the same bits; the sums of squares, whose float32 partial sums fall into
    other lanes, within the kernel's bound. An off-by-one planted in the 32-byte width fails it."""
    assert ops.extension_loaded()
    calls = _calls(tmp_path)
    cloned = _run_with("AMP_INSPECT_TEST_TENSOR_STATS_CLONES", tmp_path / "calls.pt", tmp_path / "cloned.pt")
    lanes32 = _run_with("AMP_INSPECT_TEST_TENSOR_STATS_AVX2", tmp_path / "calls.pt", tmp_path / "lanes32.pt")
    here = [torch.ops.amp_inspect.tensor_stats.default(*call) for call in calls]  # this machine's own choice
    _assert_same_statistics(calls, lanes32, cloned, here)


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@pytest.mark.skipif(
    not {"avx512f", "avx512cd", "avx512bw", "avx512vl", "avx512dq", "avx512vbmi", "gfni", "avx512_vpopcntdq"}
    <= _cpu_flags(),
    reason="this CPU counts no window bit-sliced (needs AVX-512 with GFNI, VBMI and VPOPCNTDQ)",
)
def test_the_bitsliced_window_and_the_byte_compares_give_the_same_statistics(tmp_path) -> None:
    """On this CPU the window is counted bit-sliced (count_bins_bitsliced); a process with
    AMP_INSPECT_TEST_TENSOR_STATS_BYTE_WINDOW set counts it with count_bins_in_window's byte compares. Both on the
    same calls, whose windows span 1 to 120 binades (the bit-sliced form's widest, 31, and one more among them):
    every count, histogram bin and extreme the same bits."""
    assert ops.extension_loaded()
    calls = _calls(tmp_path)
    byte_window = _run_with("AMP_INSPECT_TEST_TENSOR_STATS_BYTE_WINDOW", tmp_path / "calls.pt", tmp_path / "bytes.pt")
    here = [torch.ops.amp_inspect.tensor_stats.default(*call) for call in calls]
    _assert_same_statistics(calls, byte_window, here)
