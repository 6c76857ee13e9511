"""Hugging Face accelerate's loop, with the real package (issue 18, case 18): ``attach(model, accelerator.scaler)``
after ``prepare``, ``check()`` after ``accelerator.backward(loss)``, before ``optimizer.step()``.

On a CPU-only machine accelerate makes no GradScaler (bf16 needs none; fp16 on CPU falls back to fp32), so
the scaled path is run by handing accelerate a CPU GradScaler before ``prepare``: its own ``backward`` scales
the loss and its optimizer wrapper steps and updates that scaler, as it does on CUDA with its own.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import amp_inspect

accelerate = pytest.importorskip("accelerate")


@pytest.fixture
def fresh_accelerator():
    """accelerate keeps one process-wide state; each test starts from a clean one."""
    from accelerate.state import AcceleratorState, GradientState

    yield accelerate.Accelerator
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _run(accelerator, model, optimizer, insp, steps: int, bad: set[int]) -> list[amp_inspect.StepReport]:
    reports = []
    for step in range(steps):
        loss = model(torch.randn(4, 8)).float().pow(2).mean()
        accelerator.backward(loss)
        if step in bad:
            model[2].weight.grad.fill_(math.inf)
        reports.append(insp.check())
        optimizer.step()
        optimizer.zero_grad()
    return reports


def test_bf16_accelerator_has_no_scaler_and_check_after_backward_works(fresh_accelerator) -> None:
    accelerator = fresh_accelerator(mixed_precision="bf16", cpu=True)
    assert accelerator.scaler is None  # bf16: no loss scale
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    insp = amp_inspect.attach(model, accelerator.scaler)
    reports = _run(accelerator, model, optimizer, insp, 4, bad={2})
    insp.detach()
    # No scaler: nothing skips step 2, the optimizer applies the Inf, and step 3's gradients are non-finite too.
    assert [r.found_inf for r in reports] == [False, False, True, True]
    assert reports[2].offenders == ["2"] and reports[2].scale is None
    assert not reports[2].skips and "poisoned" in str(reports[2])
    assert reports[0].total_norm > 0 and math.isfinite(reports[0].total_norm)


def test_a_gradscaler_in_accelerate_is_read_and_its_skips_seen(fresh_accelerator) -> None:
    accelerator = fresh_accelerator(cpu=True)
    accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)  # what fp16 on CUDA makes itself
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    insp = amp_inspect.attach(model, accelerator.scaler)
    reports = _run(accelerator, model, optimizer, insp, 4, bad={1})
    insp.detach()
    assert [r.found_inf for r in reports] == [False, True, False, False]
    assert reports[1].skips and reports[1].offenders == ["2"]
    assert reports[0].scale == 2.0**8 and reports[2].scale == 2.0**7  # the skip halved accelerate's scale
    assert all(math.isfinite(p.detach().sum().item()) for p in model.parameters())  # the skip kept the weights


def test_an_inspecting_gradscaler_given_to_accelerate(fresh_accelerator) -> None:
    accelerator = fresh_accelerator(cpu=True)
    accelerator.scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=2.0**8)
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    insp = amp_inspect.attach(model, accelerator.scaler)
    reports = _run(accelerator, model, optimizer, insp, 3, bad={1})
    insp.detach()
    assert [r.found_inf for r in reports] == [False, True, False]
    assert [r.step for r in insp.history] == [0, 1, 2]


@pytest.mark.parametrize("poisoned", [True, False])
def test_save_state_from_nan_weights_warns_and_still_saves(fresh_accelerator, tmp_path, poisoned: bool) -> None:
    """Issue 29: accelerate has no callback, so guard_checkpoints hooks save_state; NaN/Inf weights (an Inf applied
    on step 2 with no scaler to skip it) warn, naming the step they became so and the module; finite ones do not."""
    import warnings

    from amp_inspect.integrations import guard_checkpoints
    from amp_inspect.integrations._common import PoisonedCheckpointWarning

    accelerator = fresh_accelerator(mixed_precision="bf16", cpu=True)
    model = _model()
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.01))
    insp = amp_inspect.attach(model, accelerator.scaler)
    handle = guard_checkpoints(accelerator, insp)
    _run(accelerator, model, optimizer, insp, 4, bad={2} if poisoned else set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator.save_state(str(tmp_path / "ckpt"))
    said = [str(w.message) for w in caught if issubclass(w.category, PoisonedCheckpointWarning)]
    assert any((tmp_path / "ckpt").iterdir())  # written either way: the data is the user's
    if poisoned:
        (message,) = said
        assert "accelerator.save_state(" in message and "the weights became NaN/Inf at step 3" in message
        assert "started in 2 " in message
    else:
        assert said == []
    handle.remove()
    insp.detach()


def test_guard_checkpoints_refuses_what_is_not_an_accelerator() -> None:
    from amp_inspect.integrations import guard_checkpoints

    with pytest.raises(TypeError, match="has no register_save_state_pre_hook"):
        guard_checkpoints(object(), amp_inspect.attach(_model()))
