"""The Inspector and InspectingGradScaler on CUDA: no host sync in check() or in the scaler's unscale pass,
the same decisions as GradScaler, and bf16 gradients, which torch's own CUDA unscale kernel rejects.
Every test is marked ``cuda`` and skips without a visible GPU."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import amp_inspect

pytestmark = pytest.mark.cuda


def _model(dtype: torch.dtype = torch.float32) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10)).cuda().to(dtype)


def _loss(model: nn.Module, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(32, 64, device="cuda", generator=g)
    y = torch.randint(0, 10, (32,), device="cuda", generator=g)
    with torch.autocast("cuda", dtype=torch.float16):
        return F.cross_entropy(model(x).float(), y)


def test_check_makes_no_host_sync() -> None:
    model = _model()
    scaler = torch.amp.GradScaler("cuda")
    insp = amp_inspect.attach(model, scaler)
    scaler.scale(_loss(model, 0)).backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            report = insp.check()
            assert report is not None
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert not report.found_inf and math.isfinite(report.total_norm)


def test_inspecting_scaler_unscale_makes_no_host_sync() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = amp_inspect.InspectingGradScaler("cuda")
    scaler.scale(_loss(model, 0)).backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        scaler.unscale_(opt)  # GradScaler.step's .item() is the one sync, as in torch: not exercised here
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert scaler.last_report is not None and not scaler.last_report.found_inf


@pytest.mark.parametrize("inject_at", [(), (2, 5)])
def test_inspecting_scaler_equals_gradscaler(inject_at: tuple[int, ...]) -> None:
    runs = []
    for scaler_type in (torch.amp.GradScaler, amp_inspect.InspectingGradScaler):
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        scaler = scaler_type("cuda", growth_interval=3)
        scales = []
        for step in range(10):
            scaler.scale(_loss(model, step)).backward()
            if step in inject_at:
                model[2].weight.grad[0, 0] = float("inf")
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            scales.append(scaler.get_scale())
        runs.append((scales, [p.detach().clone() for p in model.parameters()], scaler.state_dict()))
    (scales_a, params_a, state_a), (scales_b, params_b, state_b) = runs
    assert scales_a == scales_b and state_a == state_b
    for a, b in zip(params_a, params_b, strict=True):
        assert torch.equal(a, b)


def test_inspecting_scaler_unscales_bf16_grads() -> None:
    model = _model(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = amp_inspect.InspectingGradScaler("cuda")
    insp = amp_inspect.attach(model, scaler)
    loss = _loss(model, 0)
    scaler.scale(loss).backward()
    scaled = [p.grad.float().clone() for p in model.parameters()]
    scaler.unscale_(opt)
    inv = 1.0 / scaler.get_scale()
    for g, s in zip((p.grad for p in model.parameters()), scaled, strict=True):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), (s * inv).bfloat16().float(), rtol=0, atol=0)
    scaler.step(opt)
    scaler.update()
    assert insp.history[-1].skipped is False and set(scaler.last_report.by_module) == {"0", "2"}
