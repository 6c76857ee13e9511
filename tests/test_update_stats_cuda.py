"""update_stats' CUDA kernel (csrc/update_stats_kernels.cuh in _C_cuda) on a GPU against the pure-torch reference on
the CPU: counts and amax exactly, sums to a relative 2n * 2^-53 (the float64 atomics add the same terms in a
schedule's order); no host sync; CUDA graph capture. Marked ``cuda``: skipped, saying so, without a visible GPU.
(Written without a GPU at hand: the emulated kernel's tests, tests/test_update_stats_emu.py, ran; these did not.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import amp_inspect
import amp_inspect._native  # noqa: F401  (loads _C and, beside a CUDA torch of its major, _C_cuda)
from amp_inspect import _ops
from amp_inspect.reference_update import update_stats_reference
from tests.test_update_stats import DTYPES, random_step, sums_rtol

pytestmark = pytest.mark.cuda


def check_on_gpu(before, after, grads, states=()) -> None:
    if "cuda" not in _ops.UPDATE_KERNELS:
        pytest.skip("the loaded _C_cuda has no update_stats kernel")
    on_gpu = [[t.cuda() for t in ts] for ts in (before, after, grads, states)]
    got = [t.cpu() for t in torch.ops.amp_inspect.update_stats(*on_gpu)]
    want = update_stats_reference(before, after, grads, list(states))
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2])
    numel = max([t.numel() for t in before], default=1)
    torch.testing.assert_close(got[1], want[1], rtol=sums_rtol(numel), atol=0.0)


@pytest.mark.parametrize("weight", DTYPES)
@pytest.mark.parametrize("state", [*DTYPES, None])
def test_random_bits_many_chunks_and_launches(weight, state) -> None:
    rng = np.random.default_rng([DTYPES.index(weight), 3 if state is None else DTYPES.index(state)])
    sizes = [1, 255, 0, (1 << 16) + 1, 3 << 20] + [37 * i + 1 for i in range(40)]  # 45 tensors: two launches
    steps = [random_step(rng, n, weight, torch.bfloat16, state) for n in sizes]
    before, after, grads, states = (list(x) for x in zip(*steps, strict=True))
    check_on_gpu(before, after, grads, [] if state is None else states)


def test_no_host_sync() -> None:
    if "cuda" not in _ops.UPDATE_KERNELS:
        pytest.skip("the loaded _C_cuda has no update_stats kernel")
    b = torch.randn(1 << 20, device="cuda").bfloat16()
    a, g = b - 1e-5, torch.randn_like(b)
    amp_inspect.update_stats([b], [a], [g])  # warm-up: occupancy query, allocations
    torch.cuda.set_sync_debug_mode("error")
    try:
        amp_inspect.update_stats([b], [a], [g], [g.float().square()])
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_captured_in_a_cuda_graph_and_replayed() -> None:
    """The views travel in the launch's parameters: a replay measures the tensors' new contents."""
    if "cuda" not in _ops.UPDATE_KERNELS:
        pytest.skip("the loaded _C_cuda has no update_stats kernel")
    b = torch.randn(4096, device="cuda").bfloat16()
    a, g = b.clone(), torch.randn_like(b)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.ops.amp_inspect.update_stats([b], [a], [g], [])  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counts, sums, amax = torch.ops.amp_inspect.update_stats([b], [a], [g], [])
    a.copy_((b.float() + 0.5).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    want = update_stats_reference([b.cpu()], [a.cpu()], [g.cpu()], [])
    assert torch.equal(counts.cpu(), want[0]) and torch.equal(amax.cpu(), want[2])
    torch.testing.assert_close(sums.cpu(), want[1], rtol=sums_rtol(b.numel()), atol=0.0)
