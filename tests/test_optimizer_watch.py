"""attach(..., optimizer=opt, update_every=N): what optimizer.step() did (issue 22), against the test's own
comparison of every weight before and after the step."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import amp_inspect
from tests.models import SparseNet

pytestmark = pytest.mark.filterwarnings("ignore:amp_inspect. no compiled update_stats kernel:RuntimeWarning")


class Net(nn.Module):
    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)
        self.to(dtype)  # weights up to 0.25: a bf16 half-ulp at 0.1 is 2.4e-4, so most steps of 1e-5 vanish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


MODULES = {"fc1": ("fc1.weight", "fc1.bias"), "fc2": ("fc2.weight", "fc2.bias")}


def _oracle(model: nn.Module, before: dict[str, torch.Tensor], grads: dict[str, torch.Tensor]) -> dict[str, dict]:
    """Per module: elements with a finite nonzero gradient, those of them whose weight did not change, and the
    update ratio, by comparing each weight before and after the step."""
    params = dict(model.named_parameters())
    out = {}
    for module, names in MODULES.items():
        with_grad = lost = 0
        sq_change = sq_weight = 0.0
        for n in names:
            if n not in grads:
                continue
            g, b, a = grads[n], before[n], params[n].detach()
            has = torch.isfinite(g) & (g != 0)
            with_grad += int(has.sum())
            lost += int((has & (a == b)).sum())
            sq_change += float((a.double() - b.double()).square().sum())
            sq_weight += float(b.double().square().sum())
        if with_grad:
            out[module] = {"with_grad": with_grad, "lost": lost, "ratio": math.sqrt(sq_change / sq_weight)}
    return out


def _run(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    steps: int = 3,
    every: int = 1,
    scaler: torch.amp.GradScaler | None = None,
    micro_batches: int = 1,
    poison_step: int | None = None,
    log: str | None = None,
) -> tuple[amp_inspect.Inspector, list[tuple[int, dict]]]:
    """A training loop that checks each step and records the oracle of every step it measures."""
    insp = amp_inspect.attach(
        model, scaler, optimizer=optimizers if len(optimizers) > 1 else optimizers[0], update_every=every, log=log
    )
    dtype = next(model.parameters()).dtype
    oracles = []
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        for _ in range(micro_batches):
            x = torch.randn(4, 16, generator=gen).to(dtype)
            loss = model(x).float().pow(2).mean()
            if step == poison_step:
                loss = loss * float("nan")
            (scaler.scale(loss) if scaler is not None else loss).backward()
        insp.check()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        if scaler is not None:
            for o in optimizers:
                scaler.unscale_(o)
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
            for o in optimizers:
                scaler.step(o)
            scaler.update()
        else:
            for o in optimizers:
                o.step()
        if step % every == 0:
            oracles.append((step, _oracle(model, before, grads)))
        for o in optimizers:
            o.zero_grad()
    return insp, oracles


def _check_exact(update: amp_inspect.updates.report.UpdateStats, oracle: dict[str, dict]) -> None:
    assert set(update.by_module) == set(oracle)
    for module, want in oracle.items():
        got = update.by_module[module]
        assert got["numel_with_grad"] == want["with_grad"]
        assert got["lost"] == want["lost"]
        assert got["lost_fraction"] == want["lost"] / want["with_grad"]
        assert got["update_ratio"] == pytest.approx(want["ratio"], rel=1e-9, abs=0)


def test_pure_bf16_adamw_reports_the_lost_fraction_exactly() -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    insp, oracles = _run(model, [opt])
    history = insp.history
    for (step, oracle), record in zip(oracles, history, strict=True):
        assert record.step == step
        _check_exact(record.update, oracle)
    assert insp.last_update is history[-1].update
    fc2 = oracles[-1][1]["fc2"]
    assert fc2["lost"] > 0.9 * fc2["with_grad"]  # (almost) all rounded away
    assert insp.last_update.by_module["fc2"]["dtype"] == "bf16"
    assert insp.last_update.by_module["fc2"]["state_dtype"] == "bf16"
    codes = insp.doctor().codes
    assert "updates-rounded-away" in codes
    summary = str(insp.summary())
    assert "of the updates of 2 modules were rounded away (bf16 weights without a master copy" in summary
    assert "worst: fc2 " in summary and "stochastic" in summary


def test_the_same_model_in_fp32_loses_nothing() -> None:
    model = Net(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    insp, oracles = _run(model, [opt])
    for (_, oracle), record in zip(oracles, insp.history, strict=True):
        _check_exact(record.update, oracle)
    # Adam's first step moves every element with a gradient by about lr: none is lost in fp32. (Later steps can lose
    # a rare element whose m is near 0 after its gradient flipped sign, a step below 2^-24 of its weight: the
    # oracle above agrees, and it stays far below the verdict's threshold.)
    assert all(m["lost"] == 0 for m in insp.history[0].update.by_module.values())
    total = amp_inspect.updates.report.UpdateStats(None)
    for record in insp.history:
        total = total.merged(record.update)
    assert total.total()["lost_fraction"] < 0.01
    assert "updates-rounded-away" not in insp.doctor().codes
    assert "rounded away" not in str(insp.summary())


def test_fp16_adam_state_with_eps_1e_8_underflows_and_fp32_state_does_not() -> None:
    fp16 = Net(torch.float16)
    with torch.no_grad():
        for p in fp16.parameters():
            p.mul_(0.01)  # small gradients: their squares underflow fp16
    insp, _ = _run(fp16, [torch.optim.Adam(fp16.parameters(), lr=1e-3, eps=1e-8)], steps=2)
    first = insp.history[0].update  # eps 1e-8 is 0 in fp16: the step divides by 0 and the weights go Inf
    assert first.by_module["fc1"]["state_underflow"] > 0
    assert first.by_module["fc1"]["state_dtype"] == "fp16"
    assert first.by_module["fc1"]["weight_nonfinite"] > 0
    doctor = insp.doctor()
    assert "optimizer-state-underflow" in doctor.codes
    found = next(f for f in doctor.findings if f.code == "optimizer-state-underflow")
    assert "eps to about 1e-4" in found.fix
    # The weights that step 0 made Inf from finite weights and gradients: the error that says where the NaN started.
    assert first.by_module["fc1"]["made_nonfinite"] == first.by_module["fc1"]["weight_nonfinite"] > 0
    made = next(f for f in doctor.findings if f.code == "optimizer-made-nonfinite")
    assert made.severity == "error" and "first on step 0" in made.message and "fc1" in made.message
    assert "Adam's exp_avg_sq is zero or subnormal" in made.fix

    fp32 = Net(torch.float32)
    with torch.no_grad():
        for p in fp32.parameters():
            p.mul_(0.01)
    insp32, _ = _run(fp32, [torch.optim.Adam(fp32.parameters(), lr=1e-3, eps=1e-8)], steps=2)
    assert all(m["state_underflow"] == 0 for m in insp32.last_update.by_module.values())
    assert "optimizer-state-underflow" not in insp32.doctor().codes
    assert "optimizer-made-nonfinite" not in insp32.doctor().codes


def test_an_update_past_fp16s_largest_value_is_named_and_a_nan_gradient_applied_is_not() -> None:
    big = Net(torch.float16)
    opt = torch.optim.SGD(big.fc2.parameters(), lr=1000.0)
    insp = amp_inspect.attach(big, optimizer=opt, update_every=1)
    with torch.no_grad():
        big.fc2.weight.fill_(65000.0)  # one step of +1000 takes it past fp16's largest value, 65504: Inf
    for p in big.parameters():
        p.grad = torch.full_like(p, -1.0)  # finite gradients
    insp.check()
    opt.step()
    assert insp.last_update.by_module["fc2"]["made_nonfinite"] == big.fc2.weight.numel()
    made = next(f for f in insp.doctor().findings if f.code == "optimizer-made-nonfinite")
    assert "(fc2)" in made.message and "went past the largest value" in made.fix
    assert "finite weights made NaN/Inf by the step" in str(insp.summary())

    # A NaN gradient the loop applies (no scaler) makes NaN weights too, but the gradients already say so (the
    # poisoned-steps advice): the step did not make them from finite ones.
    poisoned = Net(torch.float32)
    insp, _ = _run(poisoned, [torch.optim.SGD(poisoned.parameters(), lr=1e-3)], steps=1, poison_step=0)
    assert insp.last_update.by_module["fc1"]["weight_nonfinite"] > 0
    assert insp.last_update.by_module["fc1"]["made_nonfinite"] == 0
    assert "optimizer-made-nonfinite" not in insp.doctor().codes


def _fused_on_cpu(cls: type) -> bool:
    try:
        cls([nn.Parameter(torch.zeros(1))], lr=1e-3, fused=True)
    except (RuntimeError, ValueError):
        return False
    return True


@pytest.mark.parametrize("cls", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
@pytest.mark.parametrize("impl", ["single", "foreach", "fused"])
def test_each_optimizer_and_implementation(cls: type, impl: str) -> None:
    if impl == "fused" and not _fused_on_cpu(cls):
        pytest.skip(f"{cls.__name__}(fused=True) is not supported on this CPU build")
    kwargs = {"single": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}[impl]
    model = Net(torch.bfloat16)
    extra = {"momentum": 0.9} if cls is torch.optim.SGD else {}
    opt = cls(model.parameters(), lr=1e-4, **extra, **kwargs)
    insp, oracles = _run(model, [opt], steps=2)
    for (_, oracle), record in zip(oracles, insp.history, strict=True):
        _check_exact(record.update, oracle)
    state = insp.last_update.by_module["fc1"]["state_dtype"]
    assert state == (None if cls is torch.optim.SGD else "bf16")


def test_every_nth_step_only_and_the_log_line_of_its_step(tmp_path) -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    log = tmp_path / "run.jsonl"
    insp, oracles = _run(model, [opt], steps=5, every=2, log=str(log))
    assert [s for s, _ in oracles] == [0, 2, 4]
    insp.detach()
    records = amp_inspect.read_log(log)
    assert [r["step"] for r in records if "update" in r] == [0, 2, 4]
    for (step, oracle), record in zip(oracles, [r for r in records if "update" in r], strict=True):
        assert record["step"] == step
        for module, want in oracle.items():
            assert record["update"]["modules"][module]["lost"] == want["lost"]
            assert record["update"]["modules"][module]["numel_with_grad"] == want["with_grad"]


def test_a_gradscaler_skip_is_no_lost_update() -> None:
    model = Net(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    insp, oracles = _run(model, [opt], steps=3, scaler=scaler, poison_step=2)
    history = insp.history
    assert history[2].skipped
    assert history[2].update is None or not history[2].update.by_module  # the optimizer never stepped
    assert insp.last_update is history[1].update  # the last step that did step
    _check_exact(history[1].update, oracles[1][1])  # unscaled gradients, as the optimizer saw them


def test_a_fused_step_turned_off_by_found_inf_is_marked_skipped() -> None:
    if not _fused_on_cpu(torch.optim.Adam):
        pytest.skip("Adam(fused=True) is not supported on this CPU build")
    model = Net(torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    insp = amp_inspect.attach(model, scaler, optimizer=opt, update_every=1)
    loss = model(torch.randn(4, 16)).pow(2).mean() * float("nan")
    scaler.scale(loss).backward()
    insp.check()
    before = [p.detach().clone() for p in model.parameters()]
    scaler.step(opt)  # a fused optimizer is called with found_inf set and applies nothing
    scaler.update()
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    update = insp.history[-1].update
    assert update.skipped and not update.by_module
    assert not amp_inspect.updates.report.update_verdicts([update])


def test_gradient_accumulation_is_measured_on_the_step_that_applies() -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    insp, oracles = _run(model, [opt], steps=2, micro_batches=3)
    assert len(insp.history) == 2
    for (_, oracle), record in zip(oracles, insp.history, strict=True):
        _check_exact(record.update, oracle)


def _checked_every_micro_batch(every: int, accumulation: int = 4, micro_batches: int = 16) -> tuple:
    """check() on every micro-batch (to catch a NaN early), optimizer.step() on every ``accumulation``-th: the
    inspector's step numbers count micro-batches, so few or none of the steps that apply are multiples of ``every``."""
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=every)
    gen = torch.Generator().manual_seed(1)
    oracles = {}
    for i in range(micro_batches):
        model(torch.randn(4, 16, generator=gen).bfloat16()).float().pow(2).mean().backward()
        insp.check()
        if i % accumulation == accumulation - 1:
            before = {n: p.detach().clone() for n, p in model.named_parameters()}
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
            opt.step()
            oracles[i] = _oracle(model, before, grads)
            opt.zero_grad()
    measured = {r.step: r.update for r in insp.history if r.update is not None and r.update.by_module}
    return measured, oracles


@pytest.mark.parametrize(("every", "steps"), [(2, [3, 7, 11, 15]), (8, [3, 11]), (1, [3, 7, 11, 15])])
def test_check_on_every_micro_batch_measures_the_first_applying_step_after_each_multiple(every, steps) -> None:
    # The steps that apply (3, 7, 11, 15) are never multiples of 2: every=2 measured nothing and said nothing.
    measured, oracles = _checked_every_micro_batch(every)
    assert sorted(measured) == steps
    for step in steps:
        _check_exact(measured[step], oracles[step])


def test_a_step_gradscaler_skipped_moves_the_measurement_to_the_next_step() -> None:
    model = Net(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
    insp, _ = _run(model, [opt], steps=8, every=4, scaler=scaler, poison_step=4)
    assert insp.history[4].skipped
    assert [r.step for r in insp.history if r.update is not None and r.update.by_module] == [0, 5]


def test_two_optimizers_merge_by_module() -> None:
    model = Net(torch.bfloat16)
    first = torch.optim.AdamW(model.fc1.parameters(), lr=1e-5)
    second = torch.optim.SGD(model.fc2.parameters(), lr=1e-3)
    insp, oracles = _run(model, [first, second], steps=2)
    for (_, oracle), record in zip(oracles, insp.history, strict=True):
        _check_exact(record.update, oracle)
    assert insp.last_update.by_module["fc1"]["state_dtype"] == "bf16"
    assert insp.last_update.by_module["fc2"]["state_dtype"] is None


def test_an_optimizer_named_twice_is_hooked_and_measured_once() -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    insp = amp_inspect.attach(model, optimizer=[opt, opt], update_every=1)
    assert len(opt._optimizer_step_pre_hooks) == len(opt._optimizer_step_post_hooks) == 1
    insp.detach()


def test_detach_removes_the_hooks() -> None:
    model = Net(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hooks = (len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks))
    insp, _ = _run(model, [opt], steps=1)
    assert len(opt._optimizer_step_pre_hooks) == hooks[0] + 1
    insp.detach()
    assert (len(opt._optimizer_step_pre_hooks), len(opt._optimizer_step_post_hooks)) == hooks
    last = insp.last_update
    model(torch.randn(2, 16)).sum().backward()
    opt.step()
    assert insp.last_update is last


def test_off_by_default_registers_nothing() -> None:
    model = Net(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, optimizer=opt)  # no update_every: nothing measured
    assert not opt._optimizer_step_pre_hooks
    model(torch.randn(2, 16)).sum().backward()
    insp.check()
    opt.step()
    assert insp.last_update is None and insp.history[-1].update is None


def test_update_ratio_verdicts() -> None:
    big = Net(torch.float32)
    insp, _ = _run(big, [torch.optim.SGD(big.parameters(), lr=5.0)], steps=2)
    assert "update-ratio" in insp.doctor().codes
    assert "above 0.01" in str(insp.summary())

    frozen = Net(torch.float32)
    insp0, _ = _run(frozen, [torch.optim.SGD(frozen.parameters(), lr=0.0)], steps=2)
    summary = str(insp0.summary())
    assert "exactly 0 on every measured step in 2 modules" in summary
    assert "rounded away" not in summary  # fp32 weights of which nothing changed did not step: not rounding

    healthy = Net(torch.float32)
    insp1, _ = _run(healthy, [torch.optim.AdamW(healthy.parameters(), lr=1e-4)], steps=2)
    assert "update-ratio" not in insp1.doctor().codes


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"update_every": 2}, "update_every needs the optimizer"),
        ({"update_every": 0, "optimizer": "x"}, "update_every must be a positive int"),
        ({"update_every": 3, "every": 2, "optimizer": None}, "update_every needs the optimizer"),
    ],
)
def test_bad_options_are_one_sentence(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        amp_inspect.attach(Net(), **options)


def test_an_optimizer_that_is_not_one_is_refused() -> None:
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer"):
        amp_inspect.attach(Net(), optimizer="adam", update_every=1)
    model = Net()
    with pytest.raises(ValueError, match="update_every must be a multiple of every"):
        amp_inspect.attach(model, optimizer=torch.optim.SGD(model.parameters(), lr=1.0), update_every=3, every=2)


def test_a_step_given_a_closure_is_measured_after_the_closure_made_the_gradients() -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    seen: dict[str, dict] = {}

    def closure() -> torch.Tensor:  # as Lightning's: forward, backward and the check inside optimizer.step
        opt.zero_grad()
        loss = model(torch.ones(4, 16, dtype=torch.bfloat16)).float().pow(2).mean()
        loss.backward()
        insp.check()
        seen["before"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        seen["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        return loss

    opt.step(closure)
    _check_exact(insp.history[-1].update, _oracle(model, seen["before"], seen["grads"]))


def test_an_inspecting_grad_scaler_without_check() -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=2.0**8)
    insp = amp_inspect.attach(model, scaler, optimizer=opt, update_every=2)
    oracles = {}
    for step in range(3):
        scaler.scale(model(torch.randn(4, 16).to(torch.bfloat16)).float().pow(2).mean()).backward()
        scaler.unscale_(opt)  # its pass is the inspection; no check()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        scaler.step(opt)
        scaler.update()
        oracles[step] = _oracle(model, before, grads)
        opt.zero_grad()
    measured = {r.step: r.update for r in insp.history if r.update is not None}
    assert sorted(measured) == [0, 2]
    for step, update in measured.items():
        _check_exact(update, oracles[step])


def test_fsdp2_shards_sum_across_ranks(tmp_path) -> None:
    from tests.test_distributed import run_scenario

    run_scenario("fsdp2_update", 2, tmp_path, module="tests.update_dist")


def test_an_inspecting_grad_scaler_hands_over_a_skipped_measured_step_at_its_update() -> None:
    model = Net(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=2.0**8)
    insp = amp_inspect.attach(model, scaler, optimizer=opt, update_every=1)
    finalized: list[int] = []
    insp.add_listener(lambda report: finalized.append(report.step))
    for step in range(3):
        loss = model(torch.randn(4, 16)).pow(2).mean()
        if step == 1:
            loss = loss * float("inf")  # this step's gradients overflow: GradScaler skips optimizer.step()
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        assert finalized == list(range(step + 1))  # each step's report leaves at its update(), the skipped one too
        opt.zero_grad()
    skipped = insp.history[1]
    assert skipped.skipped and (skipped.update is None or not skipped.update.by_module)
    assert insp.last_update is insp.history[2].update and insp.history[2].update.by_module


def test_a_step_that_raises_inside_optimizer_step_does_not_keep_its_snapshot() -> None:
    model = Net(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)

    def out_of_memory(optimizer, args, kwargs):
        raise RuntimeError("CUDA out of memory (simulated)")

    for step in range(3):
        model(torch.randn(4, 16)).pow(2).mean().backward()
        insp.check()
        if step == 1:  # step 0's copy of the parameters went at this check(), not at the next optimizer step
            assert not insp._updates._snapshots
        if step == 0:
            handle = opt.register_step_pre_hook(out_of_memory)  # after the watch's: its snapshot is taken
            with pytest.raises(RuntimeError, match="out of memory"):
                opt.step()
            handle.remove()
        else:
            opt.step()
        opt.zero_grad()
    assert insp.last_update is not None and insp.last_update.step == 2
    assert insp.history[0].update is None or not insp.history[0].update.by_module  # it changed nothing
    insp.detach()


def test_reading_the_history_between_check_and_the_optimizer_step_loses_no_update(tmp_path) -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    log = tmp_path / "run.jsonl"
    insp = amp_inspect.attach(model, optimizer=opt, update_every=2, log=str(log))
    for step in range(5):
        model(torch.randn(4, 16).to(torch.bfloat16)).float().pow(2).mean().backward()
        insp.check()
        seen = [r.step for r in insp.history]  # e.g. a loop that logs insp.summary() before stepping
        assert seen == list(range(step if step % 2 == 0 else step + 1))  # a measured step joins after its step
        opt.step()
        opt.zero_grad()
    insp.detach()
    records = amp_inspect.read_log(log)
    assert [r["step"] for r in records] == list(range(5))
    for record in records:
        assert ("update" in record) == (record["step"] % 2 == 0)
        if "update" in record:
            assert record["update"]["modules"]["fc1"]["numel_with_grad"] > 0


def _warm_up_from_zero(dtype: torch.dtype, lr: float | torch.Tensor, steps: int = 3) -> amp_inspect.Inspector:
    """AdamW under a warm-up whose learning rate is 0 on step 0 (transformers' linear warm-up, LambdaLR), measured
    on every step. A tensor ``lr`` (a compiled step's) is on the parameters' device: read there, with the counts."""
    model = Net(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, step / 2))
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        model(torch.randn(4, 16, generator=gen).to(dtype)).float().pow(2).mean().backward()
        insp.check()
        opt.step()
        schedule.step()
        opt.zero_grad()
    return insp


@pytest.mark.parametrize("lr", [1e-3, torch.tensor(1e-3)], ids=["number", "tensor"])
def test_a_warm_up_step_at_learning_rate_0_loses_no_update(lr: float | torch.Tensor) -> None:
    # Step 0 of a warm-up from 0 changes no weight: that is what the step was asked to do, not rounding. Counted as
    # lost, it made fp32 LoRA-style runs report "17% of the updates ... rounded away (fp32 weights)".
    insp = _warm_up_from_zero(torch.float32, lr=lr.clone() if isinstance(lr, torch.Tensor) else lr)
    first = insp.history[0].update
    for record in first.by_module.values():
        assert record["numel_with_grad"] == record["lost"] == 0
        assert record["numel_lr_zero"] == record["numel"] > 0
    later = insp.history[1].update.by_module["fc1"]
    assert later["numel_with_grad"] > 0 and later["numel_lr_zero"] == 0
    assert "updates-rounded-away" not in insp.doctor().codes
    assert "rounded away" not in str(insp.summary()) and "exactly 0" not in str(insp.summary())


def test_a_warm_up_from_0_still_finds_the_updates_bf16_rounds_away() -> None:
    insp = _warm_up_from_zero(torch.bfloat16, lr=1e-5)
    assert insp.history[0].update.by_module["fc2"]["lost"] == 0
    assert insp.history[2].update.by_module["fc2"]["lost_fraction"] > 0.9
    assert "updates-rounded-away" in insp.doctor().codes


def test_a_group_frozen_by_learning_rate_0_is_named_as_not_training_not_as_rounded_away() -> None:
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(
        [{"params": model.fc1.parameters(), "lr": 0.0}, {"params": model.fc2.parameters()}], lr=1e-5
    )
    insp, _ = _run(model, [opt], steps=2)
    summary = str(insp.summary())
    assert "worst: fc2 " in summary and "of the updates of 1 module were rounded away" in summary
    assert "exactly 0 on every measured step in 1 modules with gradients (fc1)" in summary


class WithLoraB(Net):
    """Net with a LoRA-style B beside fc2, initialised to zeros as peft does."""

    def __init__(self) -> None:
        super().__init__()
        self.lora_b = nn.Linear(32, 8, bias=False)
        nn.init.zeros_(self.lora_b.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        return self.fc2(h) + self.lora_b(h)


def test_a_module_grown_from_zeros_is_no_high_update_ratio() -> None:
    # LoRA's B starts at zeros: its ||W|| is its own updates, so ||dW|| / ||W|| starts high and falls like 1 / steps
    # whatever the learning rate. fc1's and fc2's ratios at this learning rate are about 1e-3.
    model = WithLoraB()
    insp, _ = _run(model, [torch.optim.AdamW(model.parameters(), lr=1e-4)], steps=4)
    assert math.isnan(insp.history[0].update.by_module["lora_b"]["update_ratio"])
    assert insp.history[2].update.by_module["lora_b"]["update_ratio"] > 0.1
    assert all(insp.history[2].update.by_module[m]["update_ratio"] < 0.01 for m in ("fc1", "fc2"))
    assert "update-ratio" not in insp.doctor().codes

    # The same ratios on a module that did not start at zeros are the verdict.
    model = Net(torch.float32)
    insp, _ = _run(model, [torch.optim.SGD(model.parameters(), lr=5.0)], steps=4)
    assert "update-ratio" in insp.doctor().codes


class RoundingSGD(torch.optim.Optimizer):
    """SGD on bf16 weights, the new weight computed in float32 and written back by ``rounding``: "nearest" (a plain
    copy), "stochastic" (random low 16 bits added, then cut off, as torchao's bf16_stochastic_round does; the
    optimizer says so by its ``bf16_stochastic_round`` attribute, as torchao's do) or "kahan" (the remainder kept
    in a ``kahan_comp`` buffer in the state, as optimi keeps it)."""

    def __init__(self, params: object, lr: float, rounding: str) -> None:
        super().__init__(params, {"lr": lr})
        self.rounding = rounding
        self.bf16_stochastic_round = rounding == "stochastic"
        self.gen = torch.Generator().manual_seed(3)

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                before = p.float()
                if self.rounding == "kahan":
                    comp = self.state[p].setdefault("kahan_comp", torch.zeros_like(p))
                    wanted = comp.float() - group["lr"] * p.grad.float()
                    p.copy_(before + wanted)
                    comp.copy_(wanted - (p.float() - before))
                elif self.rounding == "stochastic":
                    exact = before - group["lr"] * p.grad.float()
                    noise = torch.randint(0, 1 << 16, exact.shape, generator=self.gen, dtype=torch.int32)
                    p.copy_(((exact.view(torch.int32) + noise) & -65536).view(torch.float32))
                else:
                    p.copy_(before - group["lr"] * p.grad.float())


@pytest.mark.parametrize("rounding", ["stochastic", "kahan"])
def test_an_optimizer_that_keeps_sub_ulp_updates_is_not_told_to_use_stochastic_rounding(rounding: str) -> None:
    model = Net(torch.bfloat16)
    insp, oracles = _run(model, [RoundingSGD(model.parameters(), lr=1e-4, rounding=rounding)], steps=3)
    fc1 = insp.last_update.by_module["fc1"]
    assert oracles[-1][1]["fc1"]["lost"] > 0.5 * oracles[-1][1]["fc1"]["with_grad"]  # most weights did not change
    assert fc1["lost"] == 0 and fc1["numel_kept"] == fc1["numel"] > 0
    assert "updates-rounded-away" not in insp.doctor().codes
    assert "under stochastic rounding or compensated summation (none lost)" in str(insp.summary())

    # A group at learning rate 0 under the same optimizer is counted as that, not also as kept.
    model = Net(torch.bfloat16)
    groups = [{"params": model.fc1.parameters(), "lr": 0.0}, {"params": model.fc2.parameters()}]
    insp, _ = _run(model, [RoundingSGD(groups, lr=1e-4, rounding=rounding)], steps=1)
    fc1, fc2 = insp.last_update.by_module["fc1"], insp.last_update.by_module["fc2"]
    assert fc1["numel_lr_zero"] == fc1["numel"] and fc1["numel_kept"] == 0
    assert fc2["numel_kept"] == fc2["numel"] and fc2["numel_lr_zero"] == 0

    # The same steps rounded to nearest lose them, and say so.
    model = Net(torch.bfloat16)
    insp, oracles = _run(model, [RoundingSGD(model.parameters(), lr=1e-4, rounding="nearest")], steps=3)
    assert insp.last_update.by_module["fc1"]["lost"] == oracles[-1][1]["fc1"]["lost"] > 0
    assert insp.last_update.by_module["fc1"]["numel_kept"] == 0
    assert "updates-rounded-away" in insp.doctor().codes


@pytest.mark.parametrize("stochastic", [True, False], ids=["bf16_stochastic_round", "nearest"])
def test_torchaos_adamw_on_bf16_weights_loses_updates_only_when_it_rounds_to_nearest(stochastic: bool) -> None:
    """The real optimizer RoundingSGD stands in for above: torchao's AdamW (torchao.optim._AdamW, each parameter's
    step compiled) on bf16 weights, steps of about lr = 1e-4 against a half-ulp of 2.4e-4 at 0.1. With
    bf16_stochastic_round the unchanged weights are kept (no advice to use it); without, they are lost, as the
    oracle counts them, and the doctor says so."""
    optim = pytest.importorskip("torchao.optim")
    model = Net(torch.bfloat16)
    opt = optim._AdamW(model.parameters(), lr=1e-4, bf16_stochastic_round=stochastic)
    insp, oracles = _run(model, [opt], steps=2)
    fc1, unchanged = insp.last_update.by_module["fc1"], oracles[-1][1]["fc1"]
    assert unchanged["lost"] > 0.5 * unchanged["with_grad"]  # most weights did not move, either way
    if stochastic:
        assert fc1["lost"] == 0 and fc1["numel_kept"] == fc1["numel"] > 0
        assert "updates-rounded-away" not in insp.doctor().codes
    else:
        assert fc1["lost"] == unchanged["lost"] and fc1["numel_kept"] == 0
        assert "updates-rounded-away" in insp.doctor().codes


class Marked(torch.Tensor):
    """A tensor subclass without its own __torch_dispatch__: a plain tensor's storage, read as one."""


def test_a_parameter_of_a_tensor_subclass_is_left_out_with_one_warning() -> None:
    from tests.subclasses import Int8Weight

    model = Net(torch.float32)
    model.fc1.weight = nn.Parameter(Int8Weight.from_float(model.fc1.weight))  # torchao's int8 quantized training
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    with pytest.warns(
        RuntimeWarning, match="update_every leaves out fc1 and every other parameter held in a tensor"
    ) as w:
        for _ in range(2):
            model(torch.randn(4, 16)).pow(2).mean().backward()
            insp.check()
            opt.step()
            opt.zero_grad()
    assert sum("update_every leaves out" in str(x.message) for x in w) == 1  # once, not once per step
    assert "(Int8Weight)" in next(str(x.message) for x in w if "update_every leaves out" in str(x.message))
    assert insp.last_update.by_module["fc1"]["numel"] == model.fc1.bias.numel()  # the bias, a plain tensor
    assert insp.last_update.by_module["fc2"]["numel"] == 32 * 8 + 8

    # A subclass whose storage holds the values is measured, without a warning.
    model = Net(torch.float32)
    model.fc1.weight = nn.Parameter(Marked(model.fc1.weight.detach().clone()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        insp, _ = _run(model, [torch.optim.SGD(model.parameters(), lr=1e-3)], steps=2)
    assert insp.last_update.by_module["fc1"]["numel"] == model.fc1.weight.numel() + model.fc1.bias.numel()


def test_a_sparse_gradient_is_left_out_with_one_warning() -> None:
    model = SparseNet()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    with pytest.warns(RuntimeWarning, match=r"leaves out emb and every other parameter with a sparse gradient") as w:
        for _ in range(2):
            model(torch.randint(0, 16, (8,))).pow(2).backward()
            insp.check()
            opt.step()
            opt.zero_grad()
    assert sum("update_every leaves out" in str(x.message) for x in w) == 1  # once, not once per step
    assert set(insp.last_update.by_module) == {"head"}  # the dense layer is still measured


def test_a_float64_model_is_left_out_with_a_warning_and_a_float32_one_without() -> None:
    wide = Net(torch.float64)
    with pytest.warns(RuntimeWarning, match=r"leaves out fc1 and every other parameter of dtype torch.float64"):
        insp, _ = _run(wide, [torch.optim.SGD(wide.parameters(), lr=1e-3)], steps=1)
    assert not insp.last_update.by_module
    model = Net(torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        insp, _ = _run(model, [torch.optim.SGD(model.parameters(), lr=1e-3)], steps=1)
    assert set(insp.last_update.by_module) == {"fc1", "fc2"}


def test_a_compiled_optimizer_step_is_measured_exactly_without_a_recompile_per_step() -> None:
    """torch.compile(opt.step), the recipe for a fast step: the hooks run eagerly outside the graph. Traced, they
    guarded on the step number (a new graph on steps 1 to 7) and broke the graph reading the learning rate."""
    dynamo = pytest.importorskip("torch._dynamo")
    dynamo.reset()
    model = Net(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(1e-5))  # a tensor lr, as compiled steps want
    insp = amp_inspect.attach(model, optimizer=opt, update_every=2)
    step = torch.compile(opt.step, backend="eager")
    gen = torch.Generator().manual_seed(1)
    graphs = []
    for i in range(8):
        model(torch.randn(4, 16, generator=gen).bfloat16()).float().pow(2).mean().backward()
        insp.check()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        step()
        if i % 2 == 0:
            _check_exact(insp.last_update, _oracle(model, before, grads))
        opt.zero_grad()
        graphs.append(dynamo.utils.counters["stats"]["unique_graphs"])
    assert insp.last_update.by_module["fc1"]["lost"] > 0  # bf16 weights at lr 1e-5: the case measured
    assert graphs[1] == graphs[-1]  # measured and unmeasured steps both ran: no new graph after


def test_a_measurement_that_fails_turns_update_every_off_and_training_goes_on(monkeypatch) -> None:
    import amp_inspect.updates.watch as watch_module

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("the op cannot read this state")

    monkeypatch.setattr(watch_module, "update_stats", broken)
    model = Net(torch.float32)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    before = model.fc1.weight.detach().clone()
    with pytest.warns(RuntimeWarning, match="update_every turned off: measuring optimizer.step.. failed .RuntimeError"):
        insp, _ = _run(model, [opt], steps=3)
    assert not torch.equal(before, model.fc1.weight)  # every step applied
    assert insp.last_update is None and not opt._optimizer_step_post_hooks


def test_torchao_low_bit_state_and_stochastic_rounding() -> None:
    optim = pytest.importorskip("torchao.optim")
    model = Net(torch.bfloat16)
    model.fc1 = nn.Linear(128, 64).bfloat16()  # 8192 elements: AdamW8bit quantizes state of 4096 and more
    model.fc2 = nn.Linear(64, 8).bfloat16()
    opt = optim.AdamW8bit(model.parameters(), lr=1e-5)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    for _ in range(2):
        model(torch.randn(4, 128).bfloat16()).float().pow(2).mean().backward()
        insp.check()
        opt.step()  # the 8-bit state is a tensor subclass: left out, not a crash inside the step
        opt.zero_grad()
    assert insp.last_update.by_module["fc1"]["state_dtype"] == "mixed"  # the weight's is left out, the bias's read
    assert "updates-rounded-away" in insp.doctor().codes

    sr = optim._AdamW(model.parameters(), lr=1e-5, bf16_stochastic_round=True)
    insp.detach()
    insp = amp_inspect.attach(model, optimizer=sr, update_every=1)
    model(torch.randn(4, 128).bfloat16()).float().pow(2).mean().backward()
    insp.check()
    sr.step()
    assert insp.last_update.by_module["fc1"]["numel_kept"] > 0
    assert "updates-rounded-away" not in insp.doctor().codes


@pytest.mark.parametrize("zero", [0, 0.0, np.float32(0.0), np.float64(0.0), torch.tensor(0.0)])
def test_a_learning_rate_of_0_is_read_as_such_whatever_its_number_type(zero) -> None:
    from amp_inspect.updates.watch import _asked_to_move

    assert not bool(_asked_to_move({"lr": zero}, torch.device("cpu")))
    assert bool(_asked_to_move({"lr": zero + 1e-3}, torch.device("cpu")))


def test_lbfgs_with_check_inside_its_closure_is_measured_for_the_whole_step() -> None:
    """LBFGS calls the closure several times per step and each check() in it is an inspected step; the update is
    the whole optimizer step's (before its first closure call to its end), on the step of its first check()."""
    model = Net()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=6)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    seen: list[dict] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        insp.check()
        if not seen:
            seen.append({n: p.detach().clone() for n, p in model.named_parameters()})
            seen.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        return loss

    opt.step(closure)
    first = insp.step
    assert first > 2  # several inner iterations, each an inspected step
    measured = [r for r in insp.history if r.update is not None]
    assert [r.step for r in measured] == [0]
    _check_exact(measured[0].update, _oracle(model, *seen))
    # A second optimizer step: measured again, whole, on its own first check().
    seen.clear()
    opt.step(closure)
    measured = [r for r in insp.history if r.update is not None]
    assert [r.step for r in measured] == [0, first]
    _check_exact(measured[1].update, _oracle(model, *seen))
