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


def offset_views(rng, n: int, offsets: tuple[int, int, int, int], weight, grad, state):
    """One step's four arrays as views starting `offsets` elements into larger tensors: arrays 16-byte aligned at a
    common element, or misaligned apart."""
    whole = random_step(rng, n + max(offsets), weight, grad, state)
    return [x[offsets[k] : offsets[k] + n] for k, x in enumerate(whole)]


@pytest.mark.parametrize(
    "offsets",
    [(0, 0, 0, 0), (3, 3, 3, 3), (7, 7, 7, 7), (1, 2, 1, 1), (4, 4, 8, 4), (2, 6, 2, 2), (5, 5, 5, 0)],
    ids=lambda o: "-".join(map(str, o)),
)
def test_views_aligned_at_any_element_or_misaligned(offsets) -> None:
    """The kernel reads units of 8 elements with 16-byte loads from the first element at which all four arrays are
    16-byte aligned (bf16 weights and grads, float32 state: (4, 4, 8, 4) aligns them at 4 and 8 elements in) and the
    rest one at a time; arrays misaligned apart ((1, 2, 1, 1)) are read one element at a time. Chunks of 100 and 64
    elements put unit boundaries inside chunks and at their edges."""
    rng = np.random.default_rng([13, *offsets])
    steps = [offset_views(rng, n, offsets, torch.bfloat16, torch.bfloat16, torch.float32) for n in (9, 300, 1001)]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    assert [b.storage_offset() for b in before] == [offsets[0]] * 3
    for chunk_elems in (100, 64):
        assert_emulated_matches_reference(before, after, grads, states, chunk_elems=chunk_elems, blocks=2)


def test_dtype_combinations_interleaved_in_one_call() -> None:
    """A kernel per combination of weight, gradient and state dtype: the call's tensors, of nine combinations
    interleaved (more than one launch's worth of one of them), are each counted by their own kernel into their own
    row."""
    rng = np.random.default_rng(17)
    combos = [(w, g) for w in DTYPES for g in DTYPES]
    order = [combos[i % len(combos)] for i in range(len(combos) * 2)] + [combos[0]] * VIEWS_PER_LAUNCH
    steps = [random_step(rng, 40 + 3 * i, w, g, w) for i, (w, g) in enumerate(order)]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    assert_emulated_matches_reference(before, after, grads, states, chunk_elems=32, blocks=3)
    assert_emulated_matches_reference(before, after, grads, chunk_elems=32, blocks=3)  # and without state
