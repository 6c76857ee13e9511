"""update_stats' CUDA kernel (csrc/update_stats/update_stats_kernels.cuh in _C_cuda) on a GPU against the pure-torch
reference on the CPU: counts and amax exactly, sums to a relative 2n * 2^-53 (the float64 atomics add the same terms in
a schedule's order); no host sync; CUDA graph capture. Marked ``cuda``: skipped, saying so, without a visible GPU.
(Written without a GPU at hand: the emulated kernel's tests, tests/test_update_stats_emu.py, ran; these did not.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import amp_inspect
import amp_inspect.core._native  # noqa: F401  (loads _C and, beside a CUDA torch of its major, _C_cuda)
from amp_inspect.core import ops as _ops
from amp_inspect.core.references.update_stats import update_stats_reference
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


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_attach_measures_a_bf16_adamw_step_on_the_gpu_exactly(impl) -> None:
    """End to end on the GPU: the optimizer's step hooks, the snapshot, the kernel and the host copy, against the
    oracle that compares each weight before and after the step."""
    if "cuda" not in _ops.UPDATE_KERNELS:
        pytest.skip("the loaded _C_cuda has no update_stats kernel")
    from tests.test_optimizer_watch import Net, _check_exact, _oracle

    model = Net(torch.bfloat16).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **{impl: True})
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    for step in range(3):
        model(torch.randn(4, 16, device="cuda", dtype=torch.bfloat16)).float().pow(2).mean().backward()
        insp.check()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        if step == 2:  # the hooks' work (snapshot, update_stats, the copy to the host) makes no host sync
            torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        oracle = _oracle(model, before, grads)
        opt.zero_grad()
    assert insp.last_update is not None and insp.last_update.step == 2
    _check_exact(insp.last_update, oracle)
    assert any(r["lost"] for r in insp.last_update.by_module.values())  # bf16 at lr 1e-5 loses updates
    insp.detach()


def test_a_fused_adamw_under_gradscaler_on_the_gpu() -> None:
    """fp32 master weights under autocast and GradScaler, the step fused (its kernel unscales): exact counts on a
    clean step, and a step with Inf gradients is no lost update (GradScaler skips it)."""
    if "cuda" not in _ops.UPDATE_KERNELS:
        pytest.skip("the loaded _C_cuda has no update_stats kernel")
    from tests.test_optimizer_watch import Net, _check_exact, _oracle

    model = Net(torch.float32).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**8)
    insp = amp_inspect.attach(model, scaler, optimizer=opt, update_every=1)
    oracles = {}
    for step in range(3):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(4, 16, device="cuda")).float().pow(2).mean()
        scaler.scale(loss * (float("inf") if step == 1 else 1.0)).backward()
        insp.check()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}  # still scaled: fused unscales
        scaler.step(opt)
        scaler.update()
        oracles[step] = _oracle(model, before, grads)
        opt.zero_grad()
    history = insp.history
    assert history[1].skipped and (history[1].update is None or not history[1].update.by_module)
    for step in (0, 2):
        _check_exact(history[step].update, oracles[step])
    insp.detach()


def test_a_learning_rate_on_the_gpu_at_0_is_read_with_the_counts_without_a_sync() -> None:
    """A capturable AdamW with its learning rate a CUDA tensor, warmed up from 0: the flag lr != 0 is made on the
    device and read with the counts, so step 0 loses nothing (it was counted all lost, the GPU tensor unread)."""
    if "cuda" not in _ops.UPDATE_KERNELS:
        pytest.skip("the loaded _C_cuda has no update_stats kernel")
    from tests.test_optimizer_watch import Net

    model = Net(torch.float32).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-3, device="cuda"), capturable=True, foreach=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / 2))
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    for _ in range(2):
        model(torch.randn(4, 16, device="cuda")).float().pow(2).mean().backward()
        insp.check()
        torch.cuda.set_sync_debug_mode("error")
        try:
            opt.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        schedule.step()
        opt.zero_grad()
    first, second = insp.history[0].update.by_module["fc1"], insp.last_update.by_module["fc1"]
    assert first["numel_with_grad"] == first["lost"] == 0 and first["numel_lr_zero"] == first["numel"]
    assert second["numel_with_grad"] > 0 and second["numel_lr_zero"] == 0
    insp.detach()
