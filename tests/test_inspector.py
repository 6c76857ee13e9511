"""The Inspector (``amp_inspect.attach``) on small real models on the CPU: bf16 autocast, GradScaler("cpu").

Oracles: torch's own gradient norm and clipping, GradScaler's own skip decision, numpy's float16 cast of the
actual gradients, and the module that owns each parameter as ``named_parameters`` spells it.

Over 600 lines on purpose: every behaviour of check() on one plain GradScaler loop, sharing its helpers; the
scaler, activation, integration and distributed variants have files of their own.
"""

from __future__ import annotations

import json
import math
import threading
import warnings
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.diagnosis.history import StepRecord, summarize
from tests import models, oracles
from tests.models import (
    CNN_PARAM_MODULES,
    COUNT_FIELDS,
    DEVICES,
    GPT_PARAM_MODULES,
    STORED,
    TOKENS,
    SparseNet,
    TwoLayer,
    found_inf_of,
    fp16_oracle,
    grads_by_module,
    poison_,
    sparse_backward,
)
from tests.test_distributed import free_port

FP16_MIN_NORMAL = 2.0**-14


# One intra-op thread for the tiny models here: see the one_thread fixture in conftest.py.
pytestmark = pytest.mark.usefixtures("one_thread")


# -- helpers ---------------------------------------------------------------------------------------------


def make(kind: str) -> tuple[nn.Module, set[str], str]:
    """(model, the modules that own parameters, a module to poison) for a model kind."""
    if kind == "gpt":
        return models.gpt(), GPT_PARAM_MODULES, "blocks.1.mlp.fc2"
    return models.cnn(), CNN_PARAM_MODULES, "conv2"


def params_snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def no_forward_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks for m in model.modules())


def train(
    model: nn.Module,
    insp: amp_inspect.Inspector,
    scaler: torch.amp.GradScaler,
    opt: torch.optim.Optimizer,
    steps: int,
    poison: dict[int, tuple[str, float]] | None = None,
    on_step=None,
) -> list[amp_inspect.StepReport | None]:
    """``steps`` training steps with check() between backward and scaler.step; ``poison[step] = (module,
    value)`` writes a non-finite value into that module's gradient first."""
    reports = []
    for step in range(steps):
        models.backward(model, scaler, step)
        if poison and step in poison:
            poison_(model, *poison[step])
        reports.append(insp.check())
        if on_step is not None:
            on_step(step, model)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return reports


# -- 1. healthy steps ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
def test_healthy_step_covers_every_module_and_matches_torch_norm(kind: str) -> None:
    model, param_modules, _ = make(kind)
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    models.backward(model, scaler, 0)
    report = insp.check()
    scale = scaler.get_scale()

    assert report.step == 0 and report.scale == scale == 2.0**16
    assert not report.found_inf and report.offenders == []
    assert set(report.by_module) == set(grads_by_module(model)) == param_modules
    unique_grads = [p.grad for p in model.parameters()]  # parameters() lists a tied tensor once
    assert sum(m["numel"] for m in report.by_module.values()) == sum(g.numel() for g in unique_grads)
    for name, grads in grads_by_module(model).items():
        m = report.by_module[name]
        assert m["numel"] == sum(g.numel() for g in grads), name
        assert m["nan"] == m["posinf"] == m["neginf"] == 0, name
        torch_norm = float(torch.nn.utils.get_total_norm(grads)) / scale
        assert m["grad_norm"] == pytest.approx(torch_norm, rel=1e-5), name
        assert m["amax"] == pytest.approx(max(float(g.abs().max()) for g in grads) / scale, rel=1e-6), name

    torch_total = float(torch.nn.utils.get_total_norm(unique_grads)) / scale
    assert report.total_norm == pytest.approx(torch_total, rel=1e-5)
    assert float(report.total_norm_tensor) == pytest.approx(torch_total, rel=1e-5)
    # The same norm as clip_grad_norm_ measures on the unscaled gradients.
    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    clip_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)
    assert report.total_norm == pytest.approx(float(clip_norm), rel=1e-5)
    assert "gradients finite" in str(report)


def test_tied_and_root_parameters_are_named_once() -> None:
    model = models.gpt()
    assert model.head.weight is model.wte.weight
    insp = amp_inspect.attach(model)
    models.backward(model, None, 0)
    report = insp.check()
    assert "head" not in report.by_module  # head.weight is wte.weight: counted under its first name only
    assert report.by_module["wte"]["numel"] == model.wte.weight.numel()
    assert report.by_module["(model)"]["numel"] == model.pos.numel()
    assert report.scale is None  # no scaler: judged as stored, nothing to unscale
    assert report.total_norm == pytest.approx(
        float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])), rel=1e-5
    )


def test_only_modules_with_gradients_are_reported() -> None:
    model = models.cnn()
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    scaler.scale(torch.ones(()))
    empty = insp.check()  # before any backward: nothing to judge
    assert empty.by_module == {} and empty.total_norm == 0.0 and not empty.found_inf
    assert empty.headroom == amp_inspect.evidence.Headroom(None, None) and empty.recommended_scale is None
    assert float(insp.clip_grad_norm_(1.0)) == 0.0
    model.bn1.requires_grad_(False)
    models.backward(model, scaler, 0)
    report = insp.check()
    assert set(report.by_module) == CNN_PARAM_MODULES - {"bn1"} == set(grads_by_module(model))
    assert [h.step for h in insp.history] == [0, 1]


# -- 2. injected NaN/Inf -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_injected_nonfinite_names_the_module_and_the_step_is_skipped(kind: str, value: float) -> None:
    model, _, target = make(kind)
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    models.backward(model, scaler, 0)
    poison_(model, target, value, count=3)
    report = insp.check()
    before = params_snapshot(model)
    scale = scaler.get_scale()
    scaler.step(opt)

    assert report.offenders == [target]
    assert report.found_inf is found_inf_of(scaler, opt) is True
    key = "nan" if math.isnan(value) else ("posinf" if value > 0 else "neginf")
    assert report.by_module[target][key] == 3
    torch_total = float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    assert math.isnan(report.total_norm) == math.isnan(torch_total)
    assert math.isinf(report.total_norm) == math.isinf(torch_total)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))  # step skipped
    scaler.update()
    assert scaler.get_scale() == scale / 2
    assert insp.history[-1].skipped and insp.history[-1].offenders == [target]
    text = str(report)
    assert "GradScaler skips this step" in text and target in text


def test_module_with_more_nonfinite_values_comes_first() -> None:
    model = models.gpt()
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    models.backward(model, scaler, 0)
    poison_(model, "blocks.0.attn.qkv", math.inf, count=3)
    poison_(model, "blocks.1.mlp.fc1", math.nan, count=7)
    report = insp.check()
    assert report.offenders == ["blocks.1.mlp.fc1", "blocks.0.attn.qkv"]
    assert report.by_module["blocks.1.mlp.fc1"]["nan"] == 7
    assert report.by_module["blocks.0.attn.qkv"]["posinf"] == 3


# -- 3. tiny gradients against numpy's float16 ----------------------------------------------------------


@pytest.mark.parametrize("when", ["before_unscale", "after_unscale"])
def test_tiny_gradients_match_numpy_fp16_oracle(when: str) -> None:
    model = models.gpt()
    model.blocks[1].mlp_gain = 1e-8  # the damped branch's weight gradients land around fp16's subnormals
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    models.backward(model, scaler, 0)
    model.blocks[0].mlp.fc2.bias.grad[:4] = 0.0  # exact zeros are no underflow
    if when == "after_unscale":
        scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    report = insp.check()
    scale = scaler.get_scale()
    judge_at = scale if when == "after_unscale" else None  # stored gradients are scaled before unscale_

    for name, grads in grads_by_module(model).items():
        want = fp16_oracle(grads, judge_at)
        got = {k: report.by_module[name][k] for k in COUNT_FIELDS}
        assert got == want, name
    for name in ("blocks.1.mlp.fc1", "blocks.1.mlp.fc2"):  # the oracle saw every category in play
        m = report.by_module[name]
        assert m["underflow"] > 0 and m["subnormal"] > 0 and m["subnormal"] + m["underflow"] < m["numel"], name
    assert report.by_module["blocks.0.mlp.fc2"]["zero"] == 4

    # Headroom, checked with numpy's float16 cast of the extremes moved by powers of two (exact in float64).
    values = np.concatenate([oracles.judged_values(p.grad, judge_at) for p in model.parameters()]).astype(np.float64)
    nonzero = np.abs(values[values != 0])
    largest, smallest = nonzero.max(), nonzero.min()
    up, down = report.headroom.up, report.headroom.down
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float16(largest * 2.0**up)) and np.isinf(np.float16(largest * 2.0 ** (up + 1)))
        assert np.float16(smallest * 2.0**-down) != 0 and np.float16(smallest * 2.0 ** -(down + 1)) == 0
    shift = round(math.log2(report.recommended_scale / scale))
    if (up - down) // 2 <= up:
        assert abs((up - shift) - (down + shift)) <= 1  # the recommended scale shares the two margins
    else:
        assert shift == up  # gradients wider than fp16's range: the largest must not overflow


# -- 4. unscale_ then check == check then unscale_ --------------------------------------------------------


def assert_same_fp16_picture(a: amp_inspect.StepReport, b: amp_inspect.StepReport) -> None:
    assert set(a.by_module) == set(b.by_module)
    for name, ma in a.by_module.items():
        mb = b.by_module[name]
        assert {k: ma[k] for k in COUNT_FIELDS} == {k: mb[k] for k in COUNT_FIELDS}, name
        assert ma["amax"] == pytest.approx(mb["amax"], rel=1e-6, nan_ok=True), name
        assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=1e-6, nan_ok=True), name
    assert a.total_norm == pytest.approx(b.total_norm, rel=1e-6)
    assert a.headroom == b.headroom and a.recommended_scale == b.recommended_scale
    assert a.found_inf == b.found_inf and a.offenders == b.offenders


@pytest.mark.parametrize("kind", ["gpt", "cnn"])
def test_check_after_unscale_sees_the_same_fp16_picture(kind: str) -> None:
    model, _, target = make(kind)
    if kind == "gpt":
        model.blocks[1].mlp_gain = 1e-8
    scaler = torch.amp.GradScaler("cpu")
    before = amp_inspect.attach(model, scaler, activations="off")
    after = amp_inspect.attach(model, scaler, activations="off")
    models.backward(model, scaler, 0)
    poison_(model, target, math.inf)
    report_before = before.check()
    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    report_after = after.check()
    assert report_after.offenders == [target]
    assert_same_fp16_picture(report_before, report_after)


def _below(x: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(0)))


# Scaled gradient values at fp16's category edges (exact float32 values) and how fp16 casts them.
FP16_EDGES = {
    65504.0: "normal",
    _below(65520.0): "normal",
    65520.0: "overflow",  # the midpoint to the next binade rounds up to Inf
    FP16_MIN_NORMAL: "normal",
    _below(FP16_MIN_NORMAL): "normal",  # rounds up to 2^-14
    FP16_MIN_NORMAL - 2.0**-25: "normal",  # the midpoint ties to even: up to 2^-14
    _below(FP16_MIN_NORMAL - 2.0**-25): "subnormal",
    2.0**-24: "subnormal",
    float(np.nextafter(np.float32(2.0**-25), np.float32(1))): "subnormal",  # rounds up to 2^-24
    2.0**-25: "underflow",  # the midpoint ties to even: down to 0
    _below(2.0**-25): "underflow",
    0.0: "zero",
    1.0: "normal",
}


@pytest.mark.parametrize("scale", [2.0**16, 8.0])
def test_unscale_keeps_fp16_boundary_counts_with_power_of_two_scales(scale: float) -> None:
    """Scaled gradients exactly at fp16's category edges: x * 2^-k * 2^k is x, so no count moves."""
    values = list(FP16_EDGES) + [-v for v in FP16_EDGES]
    stored = torch.tensor(values, dtype=torch.float32)
    model = nn.Linear(len(values), 1, bias=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(torch.ones(()))  # creates the scale tensor
    model.weight.grad = stored.reshape(1, -1).clone()
    insp = amp_inspect.attach(model, scaler)
    report_before = insp.check()
    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    assert not torch.equal(model.weight.grad, stored.reshape(1, -1))  # unscaled in place
    report_after = insp.check()
    want = fp16_oracle([stored], None)
    kinds = Counter(FP16_EDGES.values())
    assert want["overflow"] == 2 * kinds["overflow"] and want["underflow"] == 2 * kinds["underflow"]
    assert want["subnormal"] == 2 * kinds["subnormal"] and want["zero"] == 2 * kinds["zero"]
    assert {k: report_before.by_module["(model)"][k] for k in COUNT_FIELDS} == want
    assert {k: report_after.by_module["(model)"][k] for k in COUNT_FIELDS} == want
    assert report_before.headroom == report_after.headroom


# -- 5. clip_grad_norm_ ------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_norm", [0.25, 1e6])
def test_clip_grad_norm_matches_torch(max_norm: float) -> None:
    model = models.gpt()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    for step in range(3):
        models.backward(model, scaler, step)
        scaler.unscale_(opt)
        insp.check()
        copies = models.grad_copies(model)  # the unscaled gradients, for torch to clip
        norm_ours = insp.clip_grad_norm_(max_norm)
        norm_theirs = torch.nn.utils.clip_grad_norm_(copies, max_norm)
        assert float(norm_ours) == pytest.approx(float(norm_theirs), rel=1e-6)
        for c, p in zip(copies, model.parameters(), strict=True):
            torch.testing.assert_close(p.grad, c.grad, rtol=1e-6, atol=0)
            if max_norm > float(norm_theirs):  # nothing to clip: the gradients are untouched, bit for bit
                assert torch.equal(p.grad, c.grad)
        if max_norm < float(norm_theirs):
            assert float(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])) == pytest.approx(
                max_norm, rel=1e-5
            )
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()


def test_clip_grad_norm_needs_this_steps_check() -> None:
    model = models.cnn()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, every=2)
    models.backward(model, scaler, 0)
    with pytest.raises(RuntimeError, match="check"):
        insp.clip_grad_norm_(1.0)  # no check() yet
    scaler.unscale_(opt)
    insp.check()
    with pytest.raises(ValueError, match="norm_type"):
        insp.clip_grad_norm_(1.0, norm_type=1.0)
    assert float(insp.clip_grad_norm_(1.0)) > 0
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    models.backward(model, scaler, 1)
    assert insp.check() is None  # step 1 is left out by every=2: there is no norm of this step
    with pytest.raises(RuntimeError, match="check"):
        insp.clip_grad_norm_(1.0)


# -- 7. forward overflow localised by the activation hooks -------------------------------------------------


LOUD = "blocks.0.mlp.fc1"  # its output reaches ~5e5 under bf16 autocast: an fp16 overflow in the forward


def loud_gpt() -> nn.Module:
    model = models.gpt()
    with torch.no_grad():
        models.param_of(model, LOUD).mul_(3e5)
    return model


def test_forward_overflow_is_localised_after_a_skip() -> None:
    model = loud_gpt()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    insp = amp_inspect.attach(model, scaler)  # activations="on_skip"
    skip_at, steps = 2, 10
    hooked, reports = [], []
    for step in range(steps):
        hooked.append(not no_forward_hooks(model))  # registered for this step's forward?
        models.backward(model, scaler, step)
        if step == skip_at:
            poison_(model, "ln_f", math.inf)
        reports.append(insp.check())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

    assert [r.found_inf for r in reports] == [step == skip_at for step in range(steps)]
    armed = [step for step in range(steps) if hooked[step]]
    # Armed from the step after the skip for a window of about arm_steps, then removed again.
    assert armed[0] == skip_at + 1 and armed == list(range(armed[0], armed[-1] + 1))
    assert insp.arm_steps <= len(armed) <= insp.arm_steps + 1
    assert no_forward_hooks(model)
    for step, report in enumerate(reports):
        if step in armed:
            assert report.first_nonfinite.startswith(f"{LOUD}: forward output overflowed fp16"), step
            assert report.first_nonfinite.endswith(f"step {step}")
        else:
            assert report.first_nonfinite is None, step
    assert [r.first_nonfinite for r in insp.history] == [r.first_nonfinite for r in reports]
    assert LOUD in str(reports[armed[0]])


def test_activation_hooks_always_and_off() -> None:
    outcomes = {}
    for mode in ("always", "off"):
        model = loud_gpt()
        scaler = torch.amp.GradScaler("cpu")
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        insp = amp_inspect.attach(model, scaler, activations=mode)
        assert no_forward_hooks(model) is (mode == "off")
        reports = train(model, insp, scaler, opt, 4, poison={1: ("ln_f", math.inf)})
        assert no_forward_hooks(model) is (mode == "off")  # "off": not even after the skip
        outcomes[mode] = (reports, params_snapshot(model))
        insp.detach()
        assert no_forward_hooks(model)
    always, off = outcomes["always"][0], outcomes["off"][0]
    assert all(r.first_nonfinite.startswith(f"{LOUD}: forward output overflowed fp16") for r in always)
    assert all(r.first_nonfinite is None for r in off)
    # Watching never changes the numbers.
    assert all(torch.equal(a, b) for a, b in zip(outcomes["always"][1], outcomes["off"][1], strict=True))


def test_activation_finding_of_an_unchecked_step_is_not_pinned_on_an_earlier_report() -> None:
    model = loud_gpt()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    insp = amp_inspect.attach(model, scaler, every=3)
    train(model, insp, scaler, opt, 6, poison={4: ("ln_f", math.inf)})  # step 4: skipped, attributed by the hook
    skipped = insp.last_report
    assert [h.step for h in insp.history] == [0, 3, 4]
    # Step 5 (not inspected) ran armed and found the loud module; the step-4 report must not claim it.
    assert skipped.step == 4 and skipped.first_nonfinite is None, skipped.first_nonfinite


# -- 8. the run log ---------------------------------------------------------------------------------------


def test_run_log_records_every_inspected_step(tmp_path) -> None:
    path = tmp_path / "run.jsonl"
    model = models.gpt()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, log=path, hist_every=2)
    reports = train(model, insp, scaler, opt, 5, poison={3: ("blocks.0.attn.proj", math.nan)})
    insp.close()

    lines = path.read_text().splitlines()
    assert len(lines) == 5
    for line in lines:  # strict JSON: NaN is stored as the string "nan"
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    records = amp_inspect.read_log(path)
    keys = {"schema", "step", "scale", "skipped", "total_norm", "offenders", "headroom", "modules"}
    assert all(keys <= set(r) for r in records)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["skipped"] for r in records] == [False, False, False, True, False]
    assert math.isnan(records[3]["total_norm"]) and records[3]["offenders"] == ["blocks.0.attn.proj"]
    assert records[4]["scale"] == records[3]["scale"] / 2
    for record, report in zip(records, reports, strict=True):
        assert record["scale"] == report.scale
        assert record["headroom"] == {"up": report.headroom.up, "down": report.headroom.down}
        assert set(record["modules"]) == GPT_PARAM_MODULES
        for name, m in record["modules"].items():
            assert {k: m[k] for k in COUNT_FIELDS} == {k: report.by_module[name][k] for k in COUNT_FIELDS}
        assert ("hist" in record) is (record["step"] % 2 == 0 or record["step"] == 3)  # and the skipped step
        for name, hist in record.get("hist", {}).items():
            assert all(0 <= int(b) < 256 for b in hist)
            assert sum(hist.values()) == record["modules"][name]["numel"]
            assert [hist.get(str(b), 0) for b in range(256)] == report.module_hist(name).tolist()

    # A run killed mid-write leaves a torn last line: read_log skips it with a warning.
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    with pytest.warns(RuntimeWarning, match="line 5"):
        torn = amp_inspect.read_log(path)
    assert [r["step"] for r in torn] == [0, 1, 2, 3]
    # A resumed run cuts the torn tail off before appending.
    with pytest.warns(RuntimeWarning, match="torn last line"):
        resumed = amp_inspect.attach(model, scaler, log=path)
    models.backward(model, scaler, 5)
    resumed.check()
    resumed.close()
    assert [r["step"] for r in amp_inspect.read_log(path)] == [0, 1, 2, 3, 0]


# -- 9. every=N -----------------------------------------------------------------------------------------


def test_every_inspects_every_nth_step_and_still_reports_skips_between(tmp_path) -> None:
    model = models.gpt()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, every=3, log=tmp_path / "run.jsonl")
    reports = train(model, insp, scaler, opt, 8, poison={4: ("blocks.1.attn.qkv", math.inf)})
    insp.close()

    assert [r is not None for r in reports] == [step % 3 == 0 for step in range(8)]
    assert [r.step for r in reports if r is not None] == [0, 3, 6]
    assert all(set(r.by_module) == GPT_PARAM_MODULES for r in reports if r is not None)
    history = insp.history
    assert [h.step for h in history] == [0, 3, 4, 6]
    skipped = history[2]
    assert skipped.skipped and skipped.offenders == ["blocks.1.attn.qkv"]
    assert skipped.scale == 2.0**16 and history[3].scale == 2.0**15
    assert math.isinf(skipped.total_norm)
    assert [r["step"] for r in amp_inspect.read_log(tmp_path / "run.jsonl")] == [0, 3, 4, 6]


# -- 10. detach and naming -------------------------------------------------------------------------------


def test_detach_removes_hooks_and_patches(tmp_path) -> None:
    model = models.gpt()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, every=2, activations="always", log=tmp_path / "run.jsonl")
    assert "_maybe_opt_step" in vars(scaler) and not no_forward_hooks(model)
    train(model, insp, scaler, opt, 2)
    log = insp._sink.log
    insp.detach()
    assert "_maybe_opt_step" not in vars(scaler) and "unscale_" not in vars(scaler)
    assert no_forward_hooks(model)
    assert log.closed and insp._sink is None
    # The scaler is GradScaler again: a skipped step is no longer inspected behind the user's back.
    models.backward(model, scaler, 2)
    poison_(model, "ln_f", math.inf)
    scaler.step(opt)
    scaler.update()
    assert [h.step for h in insp.history] == [0]


def test_context_manager_detaches() -> None:
    model = models.cnn()
    with amp_inspect.attach(model, activations="always") as insp:
        models.backward(model, None, 0)
        assert not no_forward_hooks(model)
        assert insp.check().first_nonfinite is None
    assert no_forward_hooks(model)


def _names_after_one_step(wrapper: nn.Module, inner: nn.Module) -> set[str]:
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(wrapper, scaler, activations="always")
    inputs, targets = models.batch_for(inner, 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = wrapper(inputs)
    loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    scaler.scale(loss).backward()
    report = insp.check()
    assert {e.module for e in insp.entries} == set(report.by_module)
    assert set(insp._arming.watcher.names.values()) >= set(report.by_module) - {"(model)"}
    insp.detach()
    return set(report.by_module)


def test_names_look_through_ddp() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model = models.gpt()
        ddp = nn.parallel.DistributedDataParallel(model)
        assert _names_after_one_step(ddp, model) == GPT_PARAM_MODULES
    finally:
        dist.destroy_process_group()


def test_names_look_through_data_parallel_and_compile() -> None:
    model = models.gpt()
    assert _names_after_one_step(nn.DataParallel(model), model) == GPT_PARAM_MODULES
    compiled = torch.compile(model)  # the OptimizedModule wrapper, never run here
    assert "_orig_mod.wte.weight" in dict(compiled.named_parameters())
    insp = amp_inspect.attach(compiled)
    models.backward(model, None, 0)
    assert set(insp.check().by_module) == GPT_PARAM_MODULES


def test_a_users_own_module_attribute_keeps_its_name() -> None:
    class Holder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = models.gpt()

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            return self.module(idx)

    holder = Holder()
    want = {f"module.{n}" for n in GPT_PARAM_MODULES - {"(model)"}} | {"module"}  # pos belongs to "module"
    assert _names_after_one_step(holder, holder.module) == want


# -- 11. summary ---------------------------------------------------------------------------------------


def test_scale_collapse_warns_once_and_summary_explains_it() -> None:
    model = models.gpt()
    scaler = torch.amp.GradScaler("cpu", growth_interval=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    insp = amp_inspect.attach(model, scaler)
    bad = range(2, 9)  # 7 skipped steps in a row
    scales = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(
            model,
            insp,
            scaler,
            opt,
            12,
            poison={s: ("blocks.0.attn.qkv", math.inf) for s in bad},
            on_step=lambda step, m: scales.append(scaler.get_scale()),
        )
    collapse = [w for w in caught if issubclass(w.category, RuntimeWarning) and "collapse" in str(w.message)]
    assert len(collapse) == 1, [str(w.message) for w in caught]
    assert "blocks.0.attn.qkv" in str(collapse[0].message)
    assert f"step {bad[0] + insp.collapse_skips - 1}" in str(collapse[0].message)

    summary = insp.summary()
    assert summary.steps == 12 and summary.skipped == len(bad)
    assert summary.skip_rate == pytest.approx(len(bad) / 12)
    assert summary.offenders == Counter({"blocks.0.attn.qkv": len(bad)})
    assert summary.warnings and "blocks.0.attn.qkv" in summary.warnings[0]
    assert any("backoff_factor" in a for a in summary.advice)
    # Events: GradScaler's own scale, step to step.
    want = [("growth" if b > a else "backoff", a, b) for a, b in zip(scales, scales[1:], strict=False) if a != b]
    assert [(e.kind, e.old, e.new) for e in summary.events] == want
    assert Counter(k for k, _, _ in want) == Counter({"backoff": len(bad), "growth": 2})
    assert "7 skipped" in str(summary)


def test_summary_advises_lower_init_scale_when_the_run_starts_skipping() -> None:
    model = models.cnn()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    insp = amp_inspect.attach(model, scaler)
    train(model, insp, scaler, opt, 6, poison={s: ("conv1", math.inf) for s in range(3)})
    summary = insp.summary()
    assert summary.skipped == 3 and summary.warnings == []
    assert any("init_scale" in a and "first 3 steps" in a for a in summary.advice)


# -- 12. bad arguments -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((lambda x: x,), {}, TypeError, "nn.Module"),
        ((nn.Linear(2, 2),), {"every": 0}, ValueError, "every"),
        ((nn.Linear(2, 2),), {"every": 1.5}, ValueError, "every"),
        ((nn.Linear(2, 2),), {"every": True}, ValueError, "every"),
        ((nn.Linear(2, 2),), {"activations": "sometimes"}, ValueError, "activations"),
        ((nn.Linear(2, 2), torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0)), {}, TypeError, "GradScaler"),
        ((nn.Linear(2, 2),), {"formats": ("fp17",)}, ValueError, "fp17"),
    ],
    ids=["not-a-module", "every-0", "every-float", "every-bool", "activations", "optimizer-as-scaler", "format"],
)
def test_bad_arguments_raise_clear_errors(args, kwargs, error, match) -> None:
    with pytest.raises(error, match=match):
        amp_inspect.attach(*args, **kwargs)


def test_check_links_a_scaler_given_later_and_counts_extra_formats() -> None:
    model = models.gpt()
    model.blocks[0].mlp_gain = 1e-9
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, formats=("fp16", "bf16"))
    models.backward(model, scaler, 0)
    report = insp.check(scaler)
    assert report.scale == scaler.get_scale()
    grads = grads_by_module(model)["blocks.0.mlp.fc2"]
    m = report.by_module["blocks.0.mlp.fc2"]
    bf16 = oracles.classify(np.concatenate([oracles.judged_values(g, None) for g in grads]), "bf16")
    assert m["subnormal/bf16"] == int(bf16["subnormal"].sum()) == 0  # bf16 has fp32's range
    assert m["underflow"] > 0 and m["underflow/bf16"] == 0
    assert report.formats == ("fp16", "bf16")


def test_skips_several_steps_apart_are_not_a_run() -> None:
    from amp_inspect.diagnosis.history import StepRecord, collapse_warning, longest_skip_run

    room = amp_inspect.evidence.Headroom(1, 1)
    history = [StepRecord(0, 1024.0, False, [], 1.0, room, None)]
    history += [StepRecord(s, 1024.0, True, ["fc"], math.inf, room, None) for s in (1, 3, 5, 7, 9)]
    assert longest_skip_run(history)[0] == 1
    assert collapse_warning(history, 5) is None


def test_float64_extremes_beyond_float32_do_not_break_the_report() -> None:
    model = nn.Linear(4, 1).double()
    insp = amp_inspect.attach(model)
    model.weight.grad = torch.tensor([[1e-300, 1e300, 1.0, 0.0]], dtype=torch.float64)
    model.bias.grad = torch.tensor([1.0], dtype=torch.float64)
    report = insp.check()
    assert report.headroom == amp_inspect.evidence.Headroom(None, None) and report.recommended_scale is None
    assert insp.history[-1].step == 0


# ---- what must not go unsaid: sparse gradients, NaN with no enabled scaler, parameters added after attach,
# two inspectors on one scaler, check() from two threads, torch.compile, meta tensors, a broken loss scale,
# complex parameters ----


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_gradient_nan_is_found_named_and_counted_by_stored_values(device: str) -> None:
    torch.manual_seed(0)
    model = SparseNet().to(device)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    sparse_backward(model, scaler, poison=True)
    report = insp.check()
    assert report.found_inf and report.skipped
    assert report.offenders == ["emb"]
    assert report.sparse_modules == ["emb"]
    assert report.by_module["emb"]["numel"] == model.emb.weight.grad.coalesce()._values().numel() == STORED
    assert report.by_module["emb"]["nan"] == 1
    assert "sparse gradients (numel counts their stored values): emb" in str(report)
    scaler.step(opt)
    skipped = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
    assert skipped == 1  # GradScaler skipped it: the report agrees
    scaler.update()
    assert insp.summary().skipped == 1
    assert insp.history[-1].offenders == ["emb"]


def test_sparse_gradient_after_unscale_is_judged_at_the_scale() -> None:
    torch.manual_seed(0)
    model = SparseNet()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler)
    sparse_backward(model, scaler, poison=False)
    before = insp.check()
    before_amax = before.by_module["emb"]["amax"]
    scaler.unscale_(opt)
    insp.step -= 1  # the same step, looked at again after unscale_
    after = insp.check()
    assert not after.found_inf
    assert after.by_module["emb"]["amax"] == pytest.approx(before_amax, rel=1e-6)
    assert after.by_module["emb"]["numel"] == STORED


@pytest.mark.parametrize("inspecting", [False, True])
def test_sparse_gradient_norms_count_a_repeated_index_once_as_torch_does(inspecting: bool) -> None:
    torch.manual_seed(0)
    model, twin = SparseNet(), SparseNet()
    twin.load_state_dict(model.state_dict())
    scaler = amp_inspect.InspectingGradScaler("cpu") if inspecting else torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, activations="off")
    sparse_backward(model, scaler, poison=False)
    twin(TOKENS).backward()
    scaler.unscale_(opt)
    report = insp.check()
    emb_norm = twin.emb.weight.grad.coalesce()._values().norm().item()
    assert emb_norm != pytest.approx(twin.emb.weight.grad._values().norm().item())  # the repeat matters here
    expected = torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.5)  # torch coalesces: the true gradient's norm
    assert report.total_norm == pytest.approx(float(expected), rel=1e-6)
    assert report.by_module["emb"]["grad_norm"] == pytest.approx(emb_norm, rel=1e-6)
    if not inspecting:
        total = insp.clip_grad_norm_(0.5)
        assert float(total) == pytest.approx(float(expected), rel=1e-6)
        for a, b in zip(model.parameters(), twin.parameters(), strict=True):
            ga = a.grad.coalesce().to_dense() if a.grad.is_sparse else a.grad
            gb = b.grad.coalesce().to_dense() if b.grad.is_sparse else b.grad
            torch.testing.assert_close(ga, gb, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scaler", [None, "disabled", "inspecting-disabled"])
def test_nan_without_an_enabled_scaler_is_a_poisoned_step_not_a_skip(scaler, tmp_path) -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    kinds = {"disabled": torch.amp.GradScaler, "inspecting-disabled": amp_inspect.InspectingGradScaler}
    gs = kinds[scaler]("cpu", enabled=False) if scaler in kinds else None
    log = tmp_path / "run.jsonl"
    insp = amp_inspect.attach(model, gs, log=log, activations="off")
    for step in range(4):
        model(torch.randn(2, 4)).sum().backward()
        if step in (1, 2):
            model.a.weight.grad[0, 0] = math.inf
        report = insp.check()
        if gs is not None:
            gs.update()  # a disabled scaler: no-op (its step() would only call optimizer.step())
        model.zero_grad()
        if step == 1:
            assert report.poisoned and not report.skipped
            text = str(report)
            assert "GradScaler skips" not in text
            assert "optimizer applies them (step poisoned)" in text
    summary = insp.summary()
    assert (summary.skipped, summary.poisoned) == (0, 2)
    assert summary.poisoned_offenders == {"a": 2}
    text = str(summary)
    assert "0 skipped" in text and "2 poisoned" in text
    assert "backoff_factor" not in text and "init_scale" not in text
    # An fp32 forward (autocast off) judged against fp16: no "bf16 needs no loss scale" (it is not a bf16 run).
    assert any("no enabled GradScaler to skip them" in a and "Find the source" in a for a in summary.advice)
    assert [r.poisoned for r in insp.history] == [False, True, True, False]
    assert not any(r.skipped for r in insp.history)
    insp.detach()
    records = amp_inspect.read_log(log)
    assert [r["poisoned"] for r in records] == [False, True, True, False]
    assert not any(r["skipped"] for r in records)
    from_log = summarize([StepRecord.from_log_record(r) for r in records])
    assert (from_log.skipped, from_log.poisoned) == (0, 2)


def test_a_parameter_added_after_attach_is_inspected_and_named() -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    insp.check()
    model.extra = nn.Linear(4, 1)  # a new head after attach
    (model(torch.randn(2, 4)).sum() + model.extra(torch.randn(2, 4)).sum()).backward()
    model.extra.weight.grad[0, 0] = math.inf
    with pytest.warns(RuntimeWarning, match=r"parameters changed since attach \(added extra.weight, extra.bias\)"):
        report = insp.check()
    assert report.found_inf and report.offenders == ["extra"]
    del model.a  # model surgery: a layer removed
    model.zero_grad()
    with pytest.warns(RuntimeWarning, match=r"removed a.weight, a.bias"):
        report = insp.check()
    assert "a" not in report.by_module
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        insp.check()  # unchanged since: no second warning


def test_detaching_one_of_two_inspectors_leaves_the_others_patches_and_skip_record() -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = amp_inspect.attach(model, scaler, every=2, activations="off")
    second = amp_inspect.attach(model, scaler, every=2, activations="off")
    first.detach()
    for step in range(2):
        model.zero_grad()
        scaler.scale(model(torch.randn(2, 4)).sum()).backward()
        if step == 1:  # a step every=2 does not inspect: the scaler's skip must still reach `second`
            model.b.weight.grad[0, 0] = math.nan
        second.check()
        scaler.unscale_(opt)
        assert id(opt) in second._scaler.patches.unscaled_params  # second's unscale_ record still runs
        scaler.step(opt)
        scaler.update()
    assert [(r.step, r.skipped) for r in second.history] == [(0, False), (1, True)]
    assert second.history[-1].offenders == ["b"]
    second.detach()
    assert "unscale_" not in vars(scaler) and "_maybe_opt_step" not in vars(scaler)


def test_detach_in_attach_order_removes_every_patch() -> None:
    scaler = torch.amp.GradScaler("cpu")
    first = amp_inspect.attach(TwoLayer(), scaler, every=2, activations="off")
    second = amp_inspect.attach(TwoLayer(), scaler, every=2, activations="off")
    second.detach()
    assert vars(scaler)["unscale_"] is first._scaler.patches._patched[0][2]
    first.detach()
    assert "unscale_" not in vars(scaler) and "_maybe_opt_step" not in vars(scaler)


def test_a_second_inspector_on_an_inspecting_scaler_is_refused() -> None:
    scaler = amp_inspect.InspectingGradScaler("cpu")
    first = amp_inspect.attach(TwoLayer(), scaler)
    with pytest.raises(RuntimeError, match="already has an inspector attached"):
        amp_inspect.attach(TwoLayer(), scaler)
    other = amp_inspect.attach(TwoLayer())
    with pytest.raises(RuntimeError, match="already has an inspector attached"):
        other.check(scaler)
    assert scaler.listener is first
    first.detach()
    amp_inspect.attach(TwoLayer(), scaler)  # free again


def test_check_from_a_second_thread_at_once_is_refused_and_records_nothing_twice() -> None:
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    inside, release = threading.Event(), threading.Event()
    refresh = insp._params.refresh  # check()'s first call

    def slow_refresh(stacklevel: int = 2) -> bool:  # holds the first check() inside, deterministically
        inside.set()
        release.wait(timeout=30)
        return refresh(stacklevel)

    insp._params.refresh = slow_refresh
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.append(insp.check()))
    worker.start()
    assert inside.wait(timeout=30)
    try:
        with pytest.raises(RuntimeError, match="check\\(\\) is already running in another thread"):
            insp.check()
    finally:
        release.set()
        worker.join(timeout=30)
    assert len(results) == 1 and results[0] is not None
    assert [r.step for r in insp.history] == [0]
    assert insp.step == 1


def test_history_read_from_another_thread_while_checking_finalizes_each_report_once() -> None:
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    stop = threading.Event()
    reader = threading.Thread(target=lambda: [insp.history for _ in iter(stop.is_set, True)])
    reader.start()
    try:
        for _ in range(200):
            insp.check()
    finally:
        stop.set()
        reader.join(timeout=30)
    assert [r.step for r in insp.history] == list(range(200))


def test_check_from_a_second_thread_one_after_the_other_is_refused_too() -> None:
    model = TwoLayer()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(2, 4)).sum().backward()
    errors: list[BaseException] = []
    go, done = threading.Event(), threading.Event()

    def loop() -> None:  # the training loop's thread: checks, then waits while the main thread tries
        insp.check()
        go.set()
        done.wait(timeout=30)
        insp.check()

    trainer = threading.Thread(target=loop, name="trainer")
    trainer.start()
    assert go.wait(timeout=30)
    try:
        insp.check()  # a monitor thread's call in between would count the same step twice
    except RuntimeError as error:
        errors.append(error)
    done.set()
    trainer.join(timeout=30)
    assert len(errors) == 1 and "thread 'trainer' calls it" in str(errors[0])
    assert [r.step for r in insp.history] == [0, 1]
    insp.check()  # the trainer thread has ended: another thread may take over
    assert [r.step for r in insp.history] == [0, 1, 2]


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _compiled_run(model: nn.Module, insp, steps: int, bad: set[int], call=None) -> list:
    reports = []
    call = model if call is None else call
    for step in range(steps):
        x = torch.randn(2, 4)
        if step in bad:
            x[0, 0] = math.inf
        call(x).sum().backward()
        reports.append(insp.check())
        for p in model.parameters():
            p.grad = None
    return reports


@pytest.mark.parametrize("backend", ["eager", "inductor"])  # inductor: the default, a real compile (seconds)
def test_producer_search_works_on_a_compiled_model(fresh_dynamo, backend: str) -> None:
    torch.manual_seed(0)
    compiled = torch.compile(TwoLayer(), backend=backend)
    insp = amp_inspect.attach(compiled, torch.amp.GradScaler("cpu"))
    reports = _compiled_run(compiled, insp, 5, bad={1, 2, 3})
    assert reports[1].found_inf and reports[2].found_inf
    # Armed after step 1's skip: step 2 ran eagerly with the hooks.
    assert reports[2].first_nonfinite is not None and reports[2].first_nonfinite.startswith("a: forward output")
    insp.detach()
    assert torch._dynamo.eval_frame._stance.stance == "default"  # the stance is restored


def test_activations_always_on_a_compiled_model_does_not_recompile_to_the_limit(fresh_dynamo) -> None:
    torch.manual_seed(0)
    compiled = torch.compile(TwoLayer(), backend="eager")
    with pytest.warns(RuntimeWarning, match="runs every step eagerly"):
        insp = amp_inspect.attach(compiled, activations="always")
    with torch._dynamo.config.patch(recompile_limit=2, fail_on_recompile_limit_hit=True):
        reports = _compiled_run(compiled, insp, 12, bad={3, 7})
    assert [r.first_nonfinite is not None for r in reports] == [s in (3, 7) for s in range(12)]
    insp.detach()
    assert torch._dynamo.eval_frame._stance.stance == "default"


def test_hooks_bypassed_by_a_compiled_wrapper_are_reported_not_silent(fresh_dynamo) -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    compiled = torch.compile(model, backend="eager")
    insp = amp_inspect.attach(model)  # the plain model, while the loop calls the compiled wrapper
    with pytest.warns(RuntimeWarning, match="saw no forward pass"):
        reports = _compiled_run(model, insp, 4, bad={1, 2}, call=compiled)
    assert reports[2].found_inf
    assert reports[2].first_nonfinite is not None and "not searched" in reports[2].first_nonfinite
    assert "torch.compile" in str(reports[2])


def test_meta_gradients_in_check_name_the_parameter() -> None:
    model = nn.Linear(2, 2, device="meta")
    model.weight.grad = torch.zeros(2, 2, device="meta")
    insp = amp_inspect.attach(model, activations="off")
    with pytest.raises(TypeError, match="parameter 'weight' is on the meta device"):
        insp.check()


@pytest.mark.parametrize("bad", [math.inf, math.nan, -1024.0])
@pytest.mark.parametrize("unscaled", [False, True])
def test_a_broken_loss_scale_is_named_not_a_math_error(bad: float, unscaled: bool) -> None:
    torch.manual_seed(0)
    model = TwoLayer()
    scaler = torch.amp.GradScaler("cpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, activations="off")
    scaler.scale(model(torch.randn(2, 4)).sum()).backward()
    scaler._scale.fill_(bad)
    if unscaled:
        scaler.unscale_(opt)
    with pytest.warns(RuntimeWarning, match="not a finite positive number: the scaler's state is broken"):
        report = insp.check()  # said at once, also to a loop that never prints its reports
    assert report.scale_problem is not None and "not a finite positive number" in report.scale_problem
    assert report.recommended_scale is None
    assert "WARNING: the loss scale is" in str(report)
    assert report.to_record()["scale_problem"] == report.scale_problem
    summary = insp.summary()
    assert any("not a finite positive number" in w for w in summary.warnings), summary.warnings


def test_complex_parameters_are_inspected_and_named() -> None:
    class Complex(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rot = nn.Linear(2, 2).to(torch.complex64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.rot(x.to(torch.complex64)).abs().sum()

    model = Complex()
    insp = amp_inspect.attach(model, activations="off")
    model(torch.randn(3, 2)).backward()
    model.rot.weight.grad[0, 0] = complex(math.nan, 0.0)
    report = insp.check()
    assert report.found_inf and report.offenders == ["rot"]
    assert report.by_module["rot"]["numel"] == 2 * (4 + 2)  # real and imaginary parts
    # The scaler takes complex gradients too (as their real and imaginary parts; torch's GradScaler cannot unscale
    # them): the same values check() judges, unscaled in place.
    model.zero_grad()
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=4.0)
    scaler.scale(model(torch.randn(3, 2))).backward()
    scaled = model.rot.weight.grad.clone()
    scaler.unscale_(torch.optim.SGD(model.parameters(), lr=0.1))
    assert scaler.last_report is not None and scaler.last_report.stats.numel.sum() == 2 * (4 + 2)
    assert torch.equal(model.rot.weight.grad, scaled / 4.0)
