"""update_stats' CUDA kernel (csrc/update_stats/update_stats_kernels.cuh) run on the CPU through the emulation
(csrc/update_stats/update_stats_emu.cpp: every CUDA thread of a block a host thread, real barriers and atomics) against
the pure-torch reference (amp_inspect/core/references/update_stats.py) and the CPU kernel: counts and amax exactly, the
sums to a relative 2n * 2^-53 (the same float64 terms added in another order). Chunks are made small and grids chosen so
that small tensors cross many chunk, block and launch boundaries. Marked ``cuda_emu``: no GPU needed; skipped, saying
so, only where the test-only library amp_inspect._C_emu is not built.

What this cannot see (needs a GPU): the memory model, code generation, registers, speed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from amp_inspect.core.references.update_stats import update_stats_reference
from tests.test_update_stats import DTYPES, adamw_step, random_step, sums_rtol

pytestmark = pytest.mark.cuda_emu

VIEWS_PER_LAUNCH = 24  # csrc/update_stats/update_stats.h kUpdateViewsPerLaunch: more tensors take more launches


def emulated(before, after, grads, states=(), *, chunk_elems=300, blocks=3):
    return torch.ops.amp_inspect._update_stats_emulated(
        list(before), list(after), list(grads), list(states), chunk_elems, blocks
    )


def assert_emulated_matches_reference(before, after, grads, states=(), **kwargs) -> None:
    got = emulated(before, after, grads, states, **kwargs)
    want = update_stats_reference(before, after, grads, list(states))
    assert torch.equal(got[0], want[0]), (got[0] - want[0]).nonzero().tolist()
    assert torch.equal(got[2], want[2]), (got[2], want[2])
    numel = max([t.numel() for t in before], default=1)
    assert torch.allclose(got[1], want[1], rtol=sums_rtol(numel), atol=0), (got[1], want[1])


@pytest.mark.parametrize("weight", DTYPES)
@pytest.mark.parametrize("state", [*DTYPES, None])
def test_emulated_kernel_equals_reference_on_random_bits(weight, state) -> None:
    rng = np.random.default_rng([7, DTYPES.index(weight), 3 if state is None else DTYPES.index(state)])
    # Sizes around the block's 256 threads and the 300-element chunk, and an empty tensor.
    sizes = (1, 255, 256, 257, 0, 299, 300, 301, 1000)
    steps = [random_step(rng, n, weight, torch.bfloat16, state) for n in sizes]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    assert_emulated_matches_reference(before, after, grads, [] if state is None else states)


@pytest.mark.parametrize(("chunk_elems", "blocks"), [(1, 2), (64, 1), (300, 7), (1 << 16, 0)])
def test_chunks_and_grids(chunk_elems, blocks) -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-5)
    assert_emulated_matches_reference(
        [before[:700]], [after[:700]], [grad[:700]], chunk_elems=chunk_elems, blocks=blocks
    )


def test_more_tensors_than_one_launch_holds() -> None:
    rng = np.random.default_rng(11)
    count = VIEWS_PER_LAUNCH * 2 + 5
    steps = [random_step(rng, 37 + i, torch.float16, torch.float32, torch.float32) for i in range(count)]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    assert_emulated_matches_reference(before, after, grads, states, chunk_elems=16, blocks=5)


def test_emulated_kernel_equals_the_cpu_kernel() -> None:
    before, after, grad = adamw_step(torch.bfloat16, 1e-5)
    state = grad.float().square()
    got = emulated([before], [after], [grad], [state], chunk_elems=1000)
    cpu = torch.ops.amp_inspect.update_stats([before], [after], [grad], [state])
    assert torch.equal(got[0], cpu[0]) and torch.equal(got[2], cpu[2])
    assert torch.allclose(got[1], cpu[1], rtol=sums_rtol(before.numel()), atol=0)
    assert got[0][0, 2] > 0  # lost updates are there to count
