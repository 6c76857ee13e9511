"""The model is walked once: ``attach`` builds one ModelView (amp_inspect/model/view.py) that every collaborator
reads, and the module tree is walked again only when the view's fingerprint says the model changed.

A walk is a call of ``named_modules()`` or ``modules()`` on the root (``named_parameters()``, which walks the
tree inside torch, is not one: it is how the fingerprint is read).
"""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.model.view import ModelView


class Walks:
    """Counts the walks of one root module (those torch makes inside named_parameters() left out)."""

    def __init__(self, root: nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = nn.Module.named_modules

        def named_modules(module: nn.Module, *args, **kwargs):
            if module is root and inspect.stack()[1].function != "_named_members":
                self.count += 1
            return original(module, *args, **kwargs)

        monkeypatch.setattr(nn.Module, "named_modules", named_modules)


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))


def _step(model: nn.Module, insp: amp_inspect.Inspector, opt: torch.optim.Optimizer) -> None:
    model(torch.randn(4, 6)).square().mean().backward()
    insp.check()
    opt.step()
    opt.zero_grad()


def test_attach_with_every_option_walks_once_and_steps_summary_doctor_never(monkeypatch) -> None:
    model = _model()
    walks = Walks(model, monkeypatch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    insp = amp_inspect.attach(model, readiness_every=1, optimizer=opt, update_every=1, activations="always")
    assert walks.count == 1  # the bar is two
    for _ in range(3):  # readiness steps, measured update steps, armed activation hooks
        _step(model, insp, opt)
    insp.summary()
    insp.doctor()
    assert walks.count == 1
    assert insp.readiness() is not None and insp.last_update is not None  # the probes did run
    insp.detach()


def test_a_changed_model_is_walked_once_more_and_then_not_again(monkeypatch) -> None:
    model = _model()
    walks = Walks(model, monkeypatch)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    insp = amp_inspect.attach(model, readiness_every=1)
    _step(model, insp, opt)
    model.append(nn.Linear(2, 2))  # a parameter added: the fingerprint changes
    with pytest.warns(RuntimeWarning, match="parameters changed since attach"):
        _step(model, insp, opt)
    assert walks.count == 2
    assert "3" in {e.module for e in insp.entries}  # the new layer is inspected
    assert "3" in insp.view.gemm_modules.values()  # and measured by format readiness
    _step(model, insp, opt)
    insp.doctor()
    assert walks.count == 2
    insp.detach()


def test_the_fingerprint_sees_a_module_wrapped_in_place() -> None:
    """Same parameters under new names (``net[0] = Wrapper(net[0])``): the view refreshes, names follow."""

    class Wrapper(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x)

    model = _model()
    view = ModelView(model)
    assert not view.refresh() and view.walks == 1
    model[0] = Wrapper(model[0])
    assert view.refresh() and view.walks == 2
    assert [e.name for e in view.entries][:2] == ["0.inner.weight", "0.inner.bias"]


def test_the_view_holds_what_the_collaborators_asked_the_model() -> None:
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 4))
    view = ModelView(nn.DataParallel(model))
    assert view.unwrapped is model and view.ddp is None
    assert view.sparse_modules == ["0"] and list(view.gemm_modules.values()) == ["1"]
    assert view.device == torch.device("cpu") and view.dtype == torch.float32
    assert not (view.compiled or view.fsdp1 or view.fsdp2)
    with pytest.raises(TypeError, match="must be an nn.Module"):
        ModelView(object())  # type: ignore[arg-type]
