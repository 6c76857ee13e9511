"""The one gradient pass (amp_inspect/gradients/gradient_pass.py): sparse and complex gradients judged the same way by
check(), by InspectingGradScaler's unscale and fused-optimizer check, and by Inspector.clip_grad_norm_; the
report built once from one or several passes."""

from __future__ import annotations

import math
import types
import warnings

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.gradients import gradient_pass
from tests.models import SparseNet

TOKENS = torch.tensor([1, 2, 1, 5])  # token 1 twice: an uncoalesced sparse gradient
STORED = 3 * 4  # values of the coalesced gradient: three distinct tokens, four features


class ComplexNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "Complex modules are a new feature"
            self.rot = nn.Linear(2, 2).to(torch.complex64)
        self.head = nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rot(x.to(torch.complex64)).abs()).sum()


def _twins(kind: type[nn.Module]) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model, twin = kind(), kind()
    twin.load_state_dict(model.state_dict())
    return model, twin


def _inputs(kind: type[nn.Module]) -> torch.Tensor:
    return TOKENS if kind is SparseNet else torch.randn(3, 2, generator=torch.Generator().manual_seed(1))


def _dense(grad: torch.Tensor) -> torch.Tensor:
    return grad.coalesce().to_dense() if grad.is_sparse else grad


# ---- which values stand for a gradient ----


def test_judged_values_of_sparse_and_complex_gradients() -> None:
    model = SparseNet()
    model(TOKENS).backward()
    grad = model.emb.weight.grad
    assert not grad.is_coalesced()
    judged = gradient_pass.judged_values(grad)
    torch.testing.assert_close(judged, grad.coalesce().values())  # a repeated index is one row
    assert judged.shape == (3, 4)
    coalesced = grad.coalesce()
    assert gradient_pass.judged_values(coalesced).data_ptr() == coalesced.values().data_ptr()  # a view, no copy
    c = torch.tensor([1 + 2j, -3j], dtype=torch.complex64)
    torch.testing.assert_close(gradient_pass.judged_values(c), torch.tensor([[1.0, 2.0], [0.0, -3.0]]))


def test_collected_sparse_gradient_writes_its_stored_values_and_judges_the_coalesced_copy() -> None:
    model = SparseNet()
    model(TOKENS).backward()
    grads = gradient_pass.of_parameters((n, n.rpartition(".")[0], p) for n, p in model.named_parameters())
    assert grads.modules == ["emb", "head", "head"] and grads.sparse_modules == ["emb"]
    assert grads.copied_rows == [0]  # uncoalesced: the judged values are a copy
    grads.written[0].mul_(2)  # a view: writing it writes the gradient
    assert torch.equal(model.emb.weight.grad._values(), grads.written[0])
    assert grads.judged[0].shape == (3, 4)


def test_other_layouts_are_refused_by_name_in_both_paths() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        csr = torch.eye(3).to_sparse_csr()
    held = types.SimpleNamespace(grad=csr)  # torch refuses a CSR .grad on a dense parameter; a holder of one
    with pytest.raises(TypeError, match=r"amp_inspect: the gradient of parameter 'w' has layout torch.sparse_csr"):
        gradient_pass.of_parameters([("w", "m", held)])
    opt = types.SimpleNamespace(param_groups=[{"params": [held]}])
    with pytest.raises(TypeError, match=r"the gradient of param_groups\[0\]\.params\[0\] has layout torch.sparse_csr"):
        gradient_pass.of_optimizer(opt, lambda p: None, allow_fp16=True)


# ---- one behaviour in check(), the scaler's unscale and its fused-optimizer check ----


@pytest.mark.parametrize("kind", [SparseNet, ComplexNet])
def test_check_and_the_inspecting_scaler_judge_the_same_values(kind: type[nn.Module]) -> None:
    model, twin = _twins(kind)
    x = _inputs(kind)
    # check() before any unscale: the scaled gradients as stored.
    plain = torch.amp.GradScaler("cpu", init_scale=1024.0)
    insp = amp_inspect.attach(twin, plain, activations="off")
    plain.scale(twin(x)).backward()
    reference = insp.check()
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=1024.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    amp_inspect.attach(model, scaler, activations="off")
    scaler.scale(model(x)).backward()
    scaler.step(opt)  # the unscale pass is the inspection
    report = scaler.last_report
    assert report.by_module.keys() == reference.by_module.keys()
    for name, want in reference.by_module.items():
        got = report.by_module[name]
        assert got["numel"] == want["numel"] and got["nan"] == want["nan"] == 0, name
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-6), name
    if kind is SparseNet:
        assert report.sparse_modules == reference.sparse_modules == ["emb"]
        assert report.by_module["emb"]["numel"] == STORED
    else:
        assert report.by_module["rot"]["numel"] == 2 * (4 + 2)  # real and imaginary parts


@pytest.mark.parametrize("kind", [SparseNet, ComplexNet])
def test_unscale_and_the_fused_optimizers_check_measure_what_check_measures(kind: type[nn.Module]) -> None:
    # InspectingGradScaler's two hooks: _unscale_grads_ (gradient_pass.unscale) and, for fused optimizers that
    # unscale themselves, _check_inf_per_device (gradient_pass.measure). Both read the same judged values.
    model = _twins(kind)[0]
    (model(_inputs(kind)) * 64).backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grads = gradient_pass.of_optimizer(opt, lambda p: None, allow_fp16=False)
    measured = gradient_pass.measure(grads, ("fp16", "bf16"))
    found = torch.zeros(())
    unscaled, per_device = gradient_pass.unscale(grads, torch.tensor(1 / 64), found, ("fp16", "bf16"))
    assert (
        unscaled is not None
        and set(per_device) == {torch.device("cpu")}
        and float(per_device[torch.device("cpu")]) == 0
    )
    for field in ("numel", "nan", "overflow", "underflow", "hist", "amax", "sumsq"):
        torch.testing.assert_close(getattr(unscaled, field), getattr(measured, field), rtol=1e-6, atol=0)
    again = gradient_pass.measure(gradient_pass.of_optimizer(opt, lambda p: None, allow_fp16=False), ("fp16",))
    torch.testing.assert_close(again.sumsq, measured.sumsq / 64**2, rtol=1e-6, atol=0)  # written: unscaled


def test_inspecting_scaler_unscales_complex_gradients_and_skips_on_their_nan() -> None:
    # Before the one gradient pass, InspectingGradScaler refused complex gradients that check() inspected.
    model, twin = _twins(ComplexNet)
    x = _inputs(ComplexNet)
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=256.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(x)).backward()
    twin(x).backward()
    scaler.unscale_(opt)
    torch.testing.assert_close(model.rot.weight.grad, twin.rot.weight.grad)  # unscaled: both parts / 256
    torch.testing.assert_close(model.head.weight.grad, twin.head.weight.grad)
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() == 256.0
    scaler.scale(model(x)).backward()
    model.rot.weight.grad[0, 0] = complex(math.nan, 0.0)
    before = model.rot.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert scaler.last_report.found_inf and scaler.last_report.offenders == ["param_groups[0].params[0]"]
    assert torch.equal(model.rot.weight, before)  # skipped
    assert scaler.get_scale() == 128.0


@pytest.mark.parametrize("kind", [SparseNet, ComplexNet])
def test_clip_grad_norm_of_sparse_and_complex_gradients_matches_torch(kind: type[nn.Module]) -> None:
    model, twin = _twins(kind)
    x = _inputs(kind)
    insp = amp_inspect.attach(model, activations="off")
    model(x).backward()
    twin(x).backward()
    insp.check()
    total = insp.clip_grad_norm_(0.1)
    expected = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.1)  # coalesces sparse ones
    assert float(total) == pytest.approx(float(expected), rel=1e-6)
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(_dense(a.grad), _dense(b.grad), rtol=1e-6, atol=1e-7)


# ---- the report, from one or several passes ----


def test_step_report_of_two_passes_keeps_the_rows_in_order() -> None:
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1))
    model(torch.randn(2, 3)).sum().backward()
    model[1].weight.grad[0, 0] = math.inf
    passes = []
    for prefix, layer in (("0", model[0]), ("1", model[1])):
        grads = gradient_pass.of_parameters((f"{prefix}.{n}", prefix, p) for n, p in layer.named_parameters())
        passes.append(gradient_pass.combined(grads, gradient_pass.measure(grads, ("fp16",)), None))
    report = gradient_pass.step_report(7, passes, None)
    whole = gradient_pass.of_parameters((n, n.partition(".")[0], p) for n, p in model.named_parameters())
    alone = gradient_pass.step_report(
        7, [gradient_pass.combined(whole, gradient_pass.measure(whole, ("fp16",)), None)], None
    )
    assert report.step == 7 and report.module_of_row == ["0", "0", "1", "1"] == alone.module_of_row
    assert report.offenders == alone.offenders == ["1"]
    assert torch.equal(report.stats.hist, alone.stats.hist) and torch.equal(report.stats.sumsq, alone.stats.sumsq)
    assert report.inf_origin is None  # no pass combined shards across ranks


def test_measure_judges_unscaled_gradients_multiplied_back_by_the_scale() -> None:
    lin = nn.Linear(4, 4)
    lin(torch.randn(2, 4)).sum().backward()
    grads = gradient_pass.of_parameters((n, "lin", p) for n, p in lin.named_parameters())
    scale = torch.tensor(2.0**10)
    mixed = gradient_pass.measure(grads, ("fp16",), scale, [True, False])
    times = gradient_pass.measure(grads, ("fp16",), scale, [True, True])
    stored = gradient_pass.measure(grads, ("fp16",))
    assert mixed.sumsq[0] == times.sumsq[0] and mixed.sumsq[1] == stored.sumsq[1]
    assert times.sumsq[0] == pytest.approx(float(stored.sumsq[0]) * 2.0**20, rel=1e-6)
    broken = gradient_pass.measure(grads, ("fp16",), torch.tensor(math.inf), [True, True])
    assert torch.equal(broken.sumsq, stored.sumsq)  # a broken scale cannot be judged at: as stored
