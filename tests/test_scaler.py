"""InspectingGradScaler against torch.amp.GradScaler on the CPU: the same training, bit for bit, with skipped
steps, unscale_ + clipping, bf16 parameters and a fused optimizer; and its reports, alone and attached."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import amp_inspect
from tests import models
from tests.models import (
    COUNT_FIELDS,
    DEVICES,
    GPT_PARAM_MODULES,
    STORED,
    SparseNet,
    found_inf_of,
    fp16_oracle,
    grads_by_module,
    poison_,
    sparse_backward,
)

STEPS = 50
POISON = {3: math.inf, 4: math.nan, 17: -math.inf, 30: math.inf}  # step -> value written into one gradient


# One intra-op thread for the tiny models here: see the one_thread fixture in conftest.py.
pytestmark = pytest.mark.usefixtures("one_thread")


def make_pair(kind: str, optimizer: str = "adam", dtype: torch.dtype = torch.float32):
    """Two identical (model, optimizer, scaler) triples: torch's GradScaler and InspectingGradScaler."""
    out = []
    for scaler_cls in (torch.amp.GradScaler, amp_inspect.InspectingGradScaler):
        model = (models.gpt() if kind == "gpt" else models.cnn()).to(dtype)
        if optimizer == "adam":
            opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        elif optimizer == "fused_adam":
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
        else:
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        out.append((model, opt, scaler_cls("cpu", growth_interval=5)))
    return out


def bf16_backward(model: nn.Module, scaler: torch.amp.GradScaler, step: int) -> None:
    """A step of a model whose parameters are bf16 (no autocast): its gradients are bf16 too."""
    inputs, targets = models.batch_for(model, step)
    loss = nn.functional.cross_entropy(model(inputs.to(torch.bfloat16)).float(), targets)
    scaler.scale(loss).backward()


def assert_same_tensors(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(x, y), f"tensor {i} differs"


def run_pair(pair, steps: int, poison: dict[int, float], target: str, *, clip: bool = False, bf16: bool = False):
    """Trains both triples on the same data; checks equality after every step. Returns the scales seen."""
    (model_t, opt_t, torch_scaler), (model_i, opt_i, ours) = pair
    scales = []
    for step in range(steps):
        decisions = []
        for model, opt, scaler in pair:
            (bf16_backward if bf16 else models.backward)(model, scaler, step)
            if step in poison:
                poison_(model, target, poison[step])
            if clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            decisions.append(found_inf_of(scaler, opt))
            scaler.update()
            opt.zero_grad()
        skipped = step in poison
        assert decisions == [skipped, skipped], step
        assert ours.last_report.step == step and ours.last_report.found_inf is skipped, step
        assert_same_tensors(list(model_t.parameters()), list(model_i.parameters()))
        assert_same_tensors(list(model_t.buffers()), list(model_i.buffers()))  # BatchNorm running stats
        assert ours.get_scale() == torch_scaler.get_scale(), step
        scales.append(ours.get_scale())
    assert torch_scaler.state_dict() == ours.state_dict()
    return scales


def assert_same_optimizer_state(opt_a: torch.optim.Optimizer, opt_b: torch.optim.Optimizer) -> None:
    state_a, state_b = opt_a.state_dict()["state"], opt_b.state_dict()["state"]
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        for name, value in state_a[key].items():
            other = state_b[key][name]
            assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, (key, name)


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
@pytest.mark.parametrize("clip", [False, True], ids=["step", "unscale_clip"])
def test_matches_gradscaler_bit_for_bit_over_50_steps_with_skips(kind: str, clip: bool) -> None:
    pair = make_pair(kind)
    target = "blocks.1.mlp.fc2" if kind == "gpt" else "conv2"
    scales = run_pair(pair, STEPS, POISON, target, clip=clip)
    # The run exercised both directions of the scale: growth every 5 clean steps, backoff on each skip.
    assert any(b > a for a, b in zip(scales, scales[1:], strict=False))
    assert sum(b < a for a, b in zip(scales, scales[1:], strict=False)) == len(POISON)
    assert_same_optimizer_state(pair[0][1], pair[1][1])


def test_bf16_gradients_match_gradscaler() -> None:
    pair = make_pair("cnn", optimizer="sgd", dtype=torch.bfloat16)
    run_pair(pair, 20, {5: math.inf, 6: math.nan, 12: math.inf}, "conv1", bf16=True)
    assert_same_optimizer_state(pair[0][1], pair[1][1])

    # The report holds the statistics of the scaled bf16 gradients, as they were before the unscale.
    model, opt, scaler = pair[1]
    bf16_backward(model, scaler, 20)
    scaled = [p.grad.clone() for p in model.parameters()]
    assert all(g.dtype == torch.bfloat16 for g in scaled)
    scaler.step(opt)
    scaler.update()
    report = scaler.last_report
    assert list(report.by_module) == [f"param_groups[0].params[{i}]" for i in range(len(scaled))]
    for i, g in enumerate(scaled):
        got = {k: report.by_module[f"param_groups[0].params[{i}]"][k] for k in COUNT_FIELDS}
        assert got == fp16_oracle([g], None), i
    assert report.total_norm == pytest.approx(
        float(torch.nn.utils.get_total_norm([g.float() for g in scaled])) / report.scale, rel=1e-5
    )


def test_fused_optimizer_matches_gradscaler() -> None:
    """A fused optimizer unscales inside its own step: the scaler inspects and writes no gradient."""
    pair = make_pair("gpt", optimizer="fused_adam")
    (model_t, opt_t, torch_scaler), (model_i, opt_i, ours) = pair
    for step in range(8):
        for model, opt, scaler in pair:
            models.backward(model, scaler, step)
            if step in (2, 5):
                poison_(model, "blocks.0.attn.proj", math.inf)
            scaler.step(opt)
        assert ours.last_report.found_inf is (step in (2, 5))
        assert_same_tensors([p.grad for p in model_t.parameters()], [p.grad for p in model_i.parameters()])
        for _, opt, scaler in pair:
            scaler.update()
            opt.zero_grad()
        assert_same_tensors(list(model_t.parameters()), list(model_i.parameters()))
        assert ours.get_scale() == torch_scaler.get_scale()
    assert torch_scaler.state_dict() == ours.state_dict()


# -- attached to an Inspector -------------------------------------------------------------------------


def test_attached_scaler_reports_go_to_history_and_log_with_module_names(tmp_path) -> None:
    model = models.gpt()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, log=tmp_path / "run.jsonl")
    # No scaler: judges the scaled gradients as they are stored (fp16 named: without a scaler, the default formats
    # would follow the bf16 autocast this loop runs under).
    as_stored = amp_inspect.attach(model, formats=("fp16",))
    for step in range(6):
        models.backward(model, scaler, step)
        if step == 2:
            poison_(model, "blocks.0.mlp.fc1", math.nan, count=5)
        stored_report = as_stored.check()  # (before the unscale pass: the same picture the scaler sees)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        report = scaler.last_report
        assert report is insp.last_report and report.step == step
        assert set(report.by_module) == GPT_PARAM_MODULES
        for name, m in report.by_module.items():
            assert {k: m[k] for k in COUNT_FIELDS} == {k: stored_report.by_module[name][k] for k in COUNT_FIELDS}
            assert m["amax"] * report.scale == pytest.approx(stored_report.by_module[name]["amax"], rel=1e-6)
    history = insp.history
    assert [h.step for h in history] == list(range(6))
    assert [h.skipped for h in history] == [step == 2 for step in range(6)]
    assert history[2].offenders == ["blocks.0.mlp.fc1"] and math.isnan(history[2].total_norm)
    insp.close()
    records = amp_inspect.read_log(tmp_path / "run.jsonl")
    assert [r["step"] for r in records] == list(range(6))
    assert records[2]["modules"]["blocks.0.mlp.fc1"]["nan"] == 5


@pytest.mark.parametrize("unscale_first", [False, True])
def test_check_with_an_inspecting_scaler_makes_one_record_per_step(unscale_first: bool) -> None:
    model = models.cnn()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    for step in range(5):
        models.backward(model, scaler, step)
        if step == 3:
            poison_(model, "fc", math.inf)
        if unscale_first:
            scaler.unscale_(opt)
            report = insp.check()
            assert report is scaler.last_report  # the unscale pass was the inspection
            copies = models.grad_copies(model)
            norm = insp.clip_grad_norm_(0.5)
            torch_norm = torch.nn.utils.clip_grad_norm_(copies, 0.5)
            if step != 3:
                assert float(norm) == pytest.approx(float(torch_norm), rel=1e-6)
                for c, p in zip(copies, model.parameters(), strict=True):
                    torch.testing.assert_close(p.grad, c.grad, rtol=1e-6, atol=0)
        else:
            report = insp.check()
        assert report.step == step and report.found_inf is (step == 3)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        assert scaler.last_report.found_inf is (step == 3)
        if not unscale_first:
            # check() judged the scaled gradients before the unscale pass: the same fp16 picture.
            for name, m in report.by_module.items():
                assert {k: m[k] for k in COUNT_FIELDS} == {
                    k: scaler.last_report.by_module[name][k] for k in COUNT_FIELDS
                }
    assert [h.step for h in insp.history] == [0, 1, 2, 3, 4]
    assert [h.skipped for h in insp.history] == [False, False, False, True, False]


def test_every_with_an_inspecting_scaler_still_reports_a_skip_between_checks() -> None:
    model = models.gpt()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, every=3)
    returned = []
    for step in range(7):
        models.backward(model, scaler, step)
        if step == 4:
            poison_(model, "wte", math.inf)
        returned.append(insp.check())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert [r is not None for r in returned] == [step % 3 == 0 for step in range(7)]
    skipped = [h for h in insp.history if h.skipped]
    assert [(h.step, h.offenders) for h in skipped] == [(4, ["wte"])]


def test_detach_unlinks_the_scaler() -> None:
    model = models.cnn()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    for step in range(2):
        models.backward(model, scaler, step)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    insp.detach()
    assert scaler.listener is None
    models.backward(model, scaler, 2)
    scaler.step(opt)
    scaler.update()
    assert [h.step for h in insp.history] == [0, 1]
    assert set(scaler.last_report.by_module) == {f"param_groups[0].params[{i}]" for i in range(10)}
    # Without a link the module names are gone; the statistics are the same pass.
    assert sum(m["numel"] for m in scaler.last_report.by_module.values()) == sum(p.numel() for p in model.parameters())
    assert set(grads_by_module(model)) == models.CNN_PARAM_MODULES


class RecordingListener:
    """A ScalerListener that is not an Inspector: the scaler needs nothing more from whoever listens."""

    formats = ("fp16", "bf16")
    group = None
    timeout = 5.0

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.ended: list[amp_inspect.StepReport | None] = []

    def module_of(self, param: torch.Tensor) -> str | None:
        return self.names.get(id(param))

    def step_ended(self, report: amp_inspect.StepReport | None) -> None:
        self.ended.append(report)


def test_any_listener_gets_module_names_formats_and_each_steps_report() -> None:
    model = models.cnn()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    listener = RecordingListener({id(p): f"p{i}" for i, p in enumerate(model.parameters())})
    scaler.set_listener(listener)
    for step in range(2):
        models.backward(model, scaler, step)
        assert (scaler.steps, scaler.unscaled_this_step) == (step, False)
        scaler.step(opt)
        assert scaler.unscaled_this_step
        scaler.update()
        opt.zero_grad()
    assert scaler.steps == 2 and [r.step for r in listener.ended] == [0, 1]
    assert listener.ended[-1] is scaler.last_report and scaler.last_report.formats == ("fp16", "bf16")
    assert set(scaler.last_report.by_module) == {f"p{i}" for i in range(10)}
    scaler.update(2.0**10)  # a step without an unscale pass: its end is still told, with no report
    assert listener.ended[-1] is None


def test_a_listener_is_removed_only_by_itself() -> None:
    scaler = amp_inspect.InspectingGradScaler("cpu")
    first, second = RecordingListener({}), RecordingListener({})
    scaler.set_listener(first)
    with pytest.raises(RuntimeError, match="already has an inspector attached"):
        scaler.set_listener(second)
    scaler.remove_listener(second)
    assert scaler.listener is first
    scaler.remove_listener(first)
    assert scaler.listener is None


def test_detaching_another_inspector_leaves_the_scalers_inspector_linked() -> None:
    model = models.cnn()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = amp_inspect.attach(model, scaler)
    other = amp_inspect.attach(models.cnn())
    with pytest.raises(RuntimeError, match="already has an inspector attached"):
        other.check(scaler)
    other.detach()
    assert scaler.listener is first
    models.backward(model, scaler, 0)
    scaler.step(opt)
    scaler.update()
    assert [h.step for h in first.history] == [0]
    assert set(first.last_report.by_module) == models.CNN_PARAM_MODULES
    first.detach()
    assert scaler.listener is None


def test_disabled_scaler_steps_plainly() -> None:
    model = models.cnn()
    scaler = amp_inspect.InspectingGradScaler("cpu", enabled=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    models.backward(model, scaler, 0)
    scaler.step(opt)
    scaler.update()
    assert scaler.last_report is None
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_two_optimizers_on_one_inspecting_scaler_make_one_report_per_step() -> None:
    model = models.cnn()
    params = list(model.parameters())
    first, second = torch.optim.SGD(params[:2], lr=0.1), torch.optim.SGD(params[2:], lr=0.1)
    scaler = amp_inspect.InspectingGradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    for step in range(3):
        models.backward(model, scaler, step)
        if step == 1:
            params[0].grad.view(-1)[0] = math.inf  # in the first optimizer's gradients
        scaler.step(first)
        scaler.step(second)
        scaler.update()
        first.zero_grad()
        second.zero_grad()
        report = scaler.last_report
        assert report.step == step and report.found_inf is (step == 1)
        assert sum(m["numel"] for m in report.by_module.values()) == sum(p.numel() for p in params)
    assert [(r.step, r.skipped) for r in insp.history] == [(0, False), (1, True), (2, False)]


def test_check_between_two_unscales_judges_each_gradient_in_its_picture() -> None:
    model = models.cnn()
    params = list(model.parameters())
    first = torch.optim.SGD(params[:2], lr=0.1)  # the rest belong to a second optimizer, not unscaled yet
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    models.backward(model, scaler, 0)
    reference = insp._inspect(0, scaler)  # all gradients still scaled: the fp16 picture as stored
    scaler.unscale_(first)
    mixed = insp.check()  # first optimizer's gradients unscaled, the second's not
    for name, want in reference.by_module.items():
        got = mixed.by_module[name]
        for key in ("overflow", "underflow", "subnormal", "zero", "nan", "posinf", "neginf"):
            assert got[key] == want[key], (name, key)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-5)


FLOAT32_SPAN = "(a loss scale is held in float32: from 2**-126 to 3.4e+38)"


@pytest.mark.parametrize("value", [1e39, pytest.param(10**400, id="10**400"), 2.0**-130])
@pytest.mark.parametrize("policy", ["torch", "headroom"])
def test_an_init_scale_float32_cannot_hold_is_refused_where_given(value, policy: str) -> None:
    """Issue 31, item 15: before, 1e39 passed the check and failed at the first scale() inside torch ("value cannot
    be converted to type float without overflow"; policy="headroom" ran at its probe without a word); 10**400
    gave OverflowError ("int too large to convert to float"); 2**-130 ran with an Inf unscale factor."""
    with pytest.raises(ValueError) as refused:
        amp_inspect.InspectingGradScaler("cpu", init_scale=value, policy=policy)
    assert str(refused.value) == (
        f"InspectingGradScaler: init_scale must be a finite number above 0, got {value!r:.60} {FLOAT32_SPAN}"
    )
    for held in (2.0**127, np.float32(1024.0), 2**10):
        scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=held)
        scaler.scale(torch.ones(()))
        assert scaler.get_scale() == float(held)


@pytest.mark.parametrize("value", [1e39, pytest.param(10**400, id="10**400"), 2.0**-130])
def test_a_checkpoint_scale_float32_cannot_hold_loads_nothing(value) -> None:
    """Issue 31, item 15: before, scale=1e39 failed inside torch's load_state_dict ("value cannot be converted to
    type float without overflow") after the scaler's _init_scale was already set; 10**400 gave OverflowError;
    2**-130 loaded (its unscale factor is Inf in float32)."""
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=2.0**10)
    scaler.scale(torch.ones(()))
    state = {**scaler.state_dict(), "scale": value}
    with pytest.raises(ValueError) as refused:
        scaler.load_state_dict(state)
    assert str(refused.value) == (
        f"InspectingGradScaler.load_state_dict: scale must be a finite number above 0, got {value!r:.60} {FLOAT32_SPAN}"
    )
    assert scaler.get_scale() == 2.0**10 and scaler._init_scale == 2.0**10
    scaler.load_state_dict({**state, "scale": 2.0**127})  # the largest scale GradScaler reaches by doubling
    assert scaler.get_scale() == 2.0**127


def test_inspecting_scaler_pickles_like_gradscaler() -> None:
    import pickle

    model = models.cnn()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = amp_inspect.InspectingGradScaler("cpu", growth_interval=7)
    amp_inspect.attach(model, scaler)
    models.backward(model, scaler, 0)
    scaler.step(opt)
    scaler.update()
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.state_dict() == scaler.state_dict() and copy.last_report is None


# ---- sparse gradients in the unscale pass ----


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("poison", [False, True])
def test_inspecting_scaler_inspects_sparse_gradients_and_stays_bitwise_equal(poison: bool, device: str) -> None:
    torch.manual_seed(0)
    mine, theirs = SparseNet().to(device), SparseNet().to(device)
    theirs.load_state_dict(mine.state_dict())
    scalers = (
        amp_inspect.InspectingGradScaler(device, init_scale=2.0**8),
        torch.amp.GradScaler(device, init_scale=2.0**8),
    )
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (mine, theirs)]
    insp = amp_inspect.attach(mine, scalers[0])
    for model, scaler, opt in zip((mine, theirs), scalers, opts, strict=True):
        sparse_backward(model, scaler, poison)
        scaler.step(opt)
        scaler.update()
    report = scalers[0].last_report
    assert report.found_inf is poison
    assert report.sparse_modules == ["emb"]
    assert report.by_module["emb"]["numel"] == STORED
    assert report.offenders == (["emb"] if poison else [])
    assert insp.summary().skipped == int(poison)
    for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b) or (poison and torch.equal(a.isnan(), b.isnan()))
    assert scalers[0].get_scale() == scalers[1].get_scale()


def test_an_interrupt_at_the_end_of_check_does_not_record_the_step_twice() -> None:
    # Ctrl-C after check() handed its report to the history, before it marked the step as its own: the
    # scaler's update() handed the same step over again (old code: history [0, 1, 2, 2, 3, 4]).
    model = models.cnn()
    scaler = amp_inspect.InspectingGradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    receive = insp.receive
    interrupts = [2]  # the step whose check() Ctrl-C interrupts, once

    def interrupted(report) -> None:
        receive(report)
        if interrupts and report.step == interrupts[0]:
            interrupts.pop()
            raise KeyboardInterrupt

    insp.receive = interrupted
    for step in range(5):
        models.backward(model, scaler, step)
        try:
            insp.check()
        except KeyboardInterrupt:
            assert step == 2
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert [h.step for h in insp.history] == [0, 1, 2, 3, 4]
    insp.detach()
