"""The case table the CUDA kernels are checked on, shared by tests/test_cuda.py (on a GPU) and
tests/test_cuda_emu.py (their source emulated on the CPU): one list, so that both run the same cases.

A case makes its tensors for a chunk size ``chunk`` (elements per work chunk: 16384 on the GPU, a small one in
the emulation), so that its sizes sit on the chunk edges of the run at hand, and lists the scales to run them at.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tests.test_random_bits import DTYPES, random_tensor, strided_layouts

GPU_CHUNK = 16384  # elements per chunk of the CUDA kernels (16-byte vector loads)
ALL_SCALES = (None, 1.0, 2.0**16, 3.0, "tensor")  # "tensor": a 0-dim scale tensor of 2^-16


def edge_sizes(chunk: int) -> tuple[int, ...]:
    """Sizes around the vector widths, an eighth of a chunk, a chunk, four chunks, and one past sixteen."""
    around = [n + d for n in (chunk // 8, chunk, 4 * chunk) for d in (-1, 0, 1)]
    return tuple(sorted({0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, *around, 16 * chunk + 1}))


def scale_of(scale: float | str | None) -> float | torch.Tensor | None:
    return torch.tensor(2.0**-16) if scale == "tensor" else scale


@dataclass(frozen=True)
class Case:
    """``make(rng, chunk, big)`` -> the tensors (``big``: a GPU run, larger strided views); run at each of
    ``scales``, checked against the oracles at ``oracle_scales`` (None: every scale)."""

    name: str
    make: Callable[[np.random.Generator, int, bool], list[torch.Tensor]]
    scales: tuple = (None,)
    oracle_scales: tuple | None = None
    one_nonfinite_each: bool = False  # every tensor holds exactly one NaN or Inf

    def __str__(self) -> str:
        return self.name

    def tensors(self, rng: np.random.Generator, chunk: int, *, big: bool = False) -> list[torch.Tensor]:
        return self.make(rng, chunk, big)

    def oracle_at(self, scale: float | str | None) -> bool:
        return self.oracle_scales is None or scale in self.oracle_scales

    def runs(self) -> list[tuple[Case, float | str | None]]:
        return [(self, scale) for scale in self.scales]


def _random_bits(dtype: torch.dtype):
    def make(rng: np.random.Generator, chunk: int, big: bool) -> list[torch.Tensor]:
        return [random_tensor(rng, n, dtype) for n in edge_sizes(chunk)]

    return make


def _unaligned(dtype: torch.dtype):
    """Slices starting 1, 2, 3 elements past a 16-byte boundary (scalar head, vector body, scalar tail) and
    ending anywhere."""

    def make(rng: np.random.Generator, chunk: int, big: bool) -> list[torch.Tensor]:
        tensors = []
        for n in (1, 5, 17, chunk - 1, chunk, chunk + 1, 4 * chunk + 1):
            base = random_tensor(rng, n + 8, dtype)
            for start in (0, 1, 2, 3):
                tensors.append(base[start : start + n])
                tensors.append(base[start : start + n - 1] if n > 1 else base[start:start])
        return tensors

    return make


def _nonfinite(dtype: torch.dtype):
    """One NaN, +Inf or -Inf per tensor at its first, middle and last element and inside its first chunk."""

    def make(rng: np.random.Generator, chunk: int, big: bool) -> list[torch.Tensor]:
        tensors = []
        for n in (chunk - 1, chunk, chunk + 1, 3 * chunk + 1):
            base = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(dtype)
            for pos, value in ((0, "nan"), (n // 2, "inf"), (n - 1, "-inf"), (chunk // 2 - 1, "nan")):
                t = base.clone()
                t[min(pos, n - 1)] = float(value)
                tensors.append(t)
        return tensors

    return make


def _strided(rng: np.random.Generator, chunk: int, big: bool) -> list[torch.Tensor]:
    return strided_layouts(rng, big=big)


CASES: list[Case] = [
    *(Case(f"random_bits_{dtype}", _random_bits(dtype), ALL_SCALES) for dtype in DTYPES),
    *(Case(f"unaligned_{dtype}", _unaligned(dtype), (None, 3.0), oracle_scales=(None,)) for dtype in DTYPES),
    *(Case(f"nonfinite_{dtype}", _nonfinite(dtype), (None,), one_nonfinite_each=True) for dtype in DTYPES),
    Case("strided_layouts", _strided, (None, 2.0**16)),
]
RUNS = [run for case in CASES for run in case.runs()]  # (case, scale): one test each
RUN_IDS = [f"{case}-{scale}" for case, scale in RUNS]
