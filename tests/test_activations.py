"""ActivationWatcher on small real models, on the CPU: which module first produced a non-finite or
overflowing forward output or output gradient, and that watching never changes the numbers."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_inspect.probes.activations import (
    FORWARD_OUTPUT,
    OUTPUT_GRADIENT,
    ActivationFinding,
    ActivationWatcher,
    module_names,
)
from tests.models import TinyGPT, batch_for

FP16_MAX = 65504.0

# -- models ---------------------------------------------------------------------------------------------


def gpt_step(model: nn.Module, autocast: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    idx, targets = batch_for(model, step=0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(idx)
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    return logits, loss


class LogShift(nn.Module):
    """log(x - 0.5): NaN below 0.5, -Inf at it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - 0.5)


class SmallCNN(nn.Module):
    def __init__(self, poison: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()]
        layers += [LogShift()] if poison else [nn.Identity()]
        layers += [nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).mean(dim=(2, 3)))


class InfGradient(torch.autograd.Function):
    """Identity forward; the gradient of its input is +Inf everywhere."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return torch.full_like(grad, math.inf)


class GradBomb(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return InfGradient.apply(x)


class GradBombNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.act = nn.Tanh()
        self.bomb = GradBomb()
        self.out = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.bomb(self.act(self.inp(x))))


# -- finding the producer --------------------------------------------------------------------------------


def test_overflow_names_the_leaf_that_produced_it_not_its_parents():
    torch.manual_seed(0)
    model = TinyGPT()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.weight.mul_(1e6)
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(1234):
        gpt_step(model)

    finding = watcher.first_finding()
    assert finding is not None
    assert (finding.module, finding.direction, finding.problem) == (
        "blocks.1.mlp.fc2",
        FORWARD_OUTPUT,
        "overflowed fp16",
    )
    assert finding.nonfinite == 0 and finding.overflow > 0 and finding.amax > FP16_MAX
    assert finding.step == 1234
    assert str(finding) == f"blocks.1.mlp.fc2: forward output overflowed fp16, amax {finding.amax:.1e}, step 1234"

    # The containers' outputs overflow too, but their hooks run after their children's.
    forward = [f.module for f in watcher.findings() if f.direction == FORWARD_OUTPUT]
    assert forward == ["blocks.1.mlp.fc2", "blocks.1.mlp", "blocks.1"]
    order = [r.module for r in watcher.records if r.direction == FORWARD_OUTPUT]
    assert order.index("blocks.1.mlp.fc1") < order.index("blocks.1.mlp.fc2") < order.index("blocks.1.mlp")
    assert order.index("blocks.1.mlp") < order.index("blocks.1") < order.index("ln_f")
    assert "blocks" not in order  # a ModuleList has no forward, so no record


def test_nan_from_a_module_is_named_non_finite():
    torch.manual_seed(0)
    model = SmallCNN(poison=True)
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        relu_out = model.features[:3](x)
    expected_nonfinite = int((relu_out - 0.5 <= 0).sum())
    assert expected_nonfinite > 0

    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(7):
        model(x).sum().backward()

    finding = watcher.first_finding()
    assert finding is not None
    assert (finding.module, finding.direction, finding.problem) == ("features.3", FORWARD_OUTPUT, "non-finite")
    assert finding.nonfinite == expected_nonfinite
    assert str(finding) == f"features.3: forward output went non-finite ({expected_nonfinite} NaN/Inf), step 7"
    clean = [r.module for r in watcher.records if r.direction == FORWARD_OUTPUT]
    assert clean[:3] == ["features.0", "features.1", "features.2"]


def test_gradient_only_problem_names_the_module_whose_output_received_it():
    torch.manual_seed(0)
    model = GradBombNet()
    x = torch.randn(5, 4)
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(3):
        model(x).sum().backward()

    findings = watcher.findings()
    assert all(f.direction == OUTPUT_GRADIENT for f in findings)  # the forward pass is clean
    backward = [r.module for r in watcher.records if r.direction == OUTPUT_GRADIENT]
    assert backward == ["out", "bomb", "act", "inp"]
    # bomb's own output gradient is clean; the Inf it makes is the gradient of act's output.
    first = watcher.first_finding()
    assert first is not None
    assert (first.module, first.direction, first.problem) == ("act", OUTPUT_GRADIENT, "non-finite")
    assert first.nonfinite == 5 * 8
    assert [f.module for f in findings] == ["act", "inp"]
    assert first.made_by == "bomb"  # and the finding says so
    assert str(first) == "act: output gradient went non-finite (40 NaN/Inf) (made in the backward of bomb), step 3"


def test_clean_model_has_no_finding():
    torch.manual_seed(0)
    model = TinyGPT()
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(0):
        gpt_step(model)
    assert watcher.first_finding() is None
    assert watcher.findings() == []
    directions = {r.direction for r in watcher.records}
    assert directions == {FORWARD_OUTPUT, OUTPUT_GRADIENT}


def test_first_format_is_the_one_judged():
    torch.manual_seed(0)
    model = TinyGPT()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.weight.mul_(1e6)
    watcher = ActivationWatcher(model, formats=("bf16", "fp16"))
    with watcher.armed_for_step(0):
        gpt_step(model)
    assert watcher.first_finding() is None  # overflows fp16, not bf16
    fc2 = next(r for r in watcher.records if r.module == "blocks.1.mlp.fc2")
    assert int(fc2.stats.overflow[0, fc2.stats.column("fp16")]) > 0


# -- watching changes nothing ----------------------------------------------------------------------------


def all_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def test_watching_is_bitwise_invisible_and_disarm_removes_every_hook():
    torch.manual_seed(0)
    plain = TinyGPT()
    watched = copy.deepcopy(plain)
    user_hook = plain.head.register_forward_hook(lambda m, a, o: None)  # someone else's hook survives
    watched.head.register_forward_hook(lambda m, a, o: None)
    baseline = all_hooks(watched)

    watcher = ActivationWatcher(watched)
    watcher.new_step(0)
    watcher.arm()
    assert watcher.armed and all_hooks(watched) == baseline + len(watcher.names)
    logits_a, loss_a = gpt_step(plain)
    logits_b, loss_b = gpt_step(watched)
    assert len(watcher.records) > 0
    assert torch.equal(logits_a, logits_b) and torch.equal(loss_a, loss_b)
    for (name, p), q in zip(plain.named_parameters(), watched.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name

    watcher.disarm()
    assert not watcher.armed and all_hooks(watched) == baseline
    assert len(watched.head._forward_hooks) == 1
    watcher.new_step(1)
    gpt_step(watched)
    assert watcher.records == []
    user_hook.remove()


def test_disarm_between_forward_and_backward_drops_the_pending_gradient_hooks():
    model = GradBombNet()
    watcher = ActivationWatcher(model)
    watcher.new_step(0)
    watcher.arm()
    out = model(torch.randn(3, 4))
    watcher.disarm()
    out.sum().backward()
    assert [r.direction for r in watcher.records] == [FORWARD_OUTPUT] * 4

    # new_step also drops them: a backward of an older forward records nothing into the new step.
    watcher.arm()
    out = model(torch.randn(3, 4))
    watcher.new_step(1)
    out.sum().backward()
    assert watcher.records == []
    watcher.disarm()


def test_in_place_ops_after_a_watched_module_still_work():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(inplace=True), nn.Linear(8, 3))
    watched = copy.deepcopy(plain)
    x = torch.randn(6, 4)

    # The Linear's own output and its gradient, as the module returned it (before the ReLU).
    pre = plain[0](x)
    pre.retain_grad()
    plain[2](torch.relu(pre)).pow(2).sum().backward()
    plain.zero_grad()
    out_a = plain(x)
    out_a.pow(2).sum().backward()

    watcher = ActivationWatcher(watched)
    with watcher.armed_for_step(0):
        out_b = watched(x)
        out_b.pow(2).sum().backward()
    assert torch.equal(out_a, out_b)
    for p, q in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)

    by_key = {(r.module, r.direction): r.stats for r in watcher.records}
    assert float(by_key["0", FORWARD_OUTPUT].amax[0]) == float(pre.detach().abs().max())
    assert float(by_key["0", OUTPUT_GRADIENT].amax[0]) == float(pre.grad.abs().max())
    assert int(by_key["0", OUTPUT_GRADIENT].zero[0]) == int((pre.grad == 0).sum()) > 0  # masked by the ReLU


def test_in_place_add_inside_a_parent_forward():
    class AddInPlace(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.lin(x)
            y += 1.0
            return y.mul_(2.0)

    torch.manual_seed(0)
    plain = AddInPlace()
    watched = copy.deepcopy(plain)
    x = torch.randn(3, 4)
    plain(x).sum().backward()
    watcher = ActivationWatcher(watched)
    with watcher.armed_for_step(0):
        watched(x).sum().backward()
    for p, q in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad)
    assert [r.module for r in watcher.records] == ["lin", "lin"]
    assert float(watcher.records[1].stats.amax[0]) == 2.0  # d(sum(2(y+1)))/dy


# -- output structures -----------------------------------------------------------------------------------


class MultiOutput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor):
        y = self.lin(x)
        poisoned = y.clone()
        poisoned[0, 0] = math.nan
        return (y, y.argmax(dim=-1), {"scores": poisoned, "mask": y > 0, "note": "text", "n": 3, "none": None}, [y])


class IndexOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(dim=-1)


class Consumer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.multi = MultiOutput()
        self.index = IndexOnly()
        self.out = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, idx, extra, _ = self.multi(x)
        picked = self.index(y)
        return self.out(y).sum() + idx.sum() * 0 + picked.sum() * 0 + extra["scores"][1:].sum()


def test_tuple_dict_and_non_float_outputs():
    torch.manual_seed(0)
    model = Consumer()
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(5):
        model(torch.randn(3, 4)).backward()

    forward = {r.module: r.stats for r in watcher.records if r.direction == FORWARD_OUTPUT}
    assert "index" not in forward  # an int tensor alone gives no record
    assert len(forward["multi"]) == 2  # y (once, though returned twice) and scores; not argmax, not the mask
    assert forward["multi"].nonfinite.tolist() == [0, 1]
    # Gradients reach both float outputs of multi; each is its own record.
    backward = [r.module for r in watcher.records if r.direction == OUTPUT_GRADIENT]
    assert backward.count("multi") == 2

    first = watcher.first_finding()
    assert first is not None
    assert (first.module, first.direction, first.problem, first.nonfinite) == ("multi", FORWARD_OUTPUT, "non-finite", 1)


def test_outputs_without_grad_or_that_are_leaves_register_no_gradient_hooks():
    model = GradBombNet()
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(0), torch.no_grad():
        model(torch.randn(2, 4))
    assert watcher._tensor_handles == []
    assert [r.direction for r in watcher.records] == [FORWARD_OUTPUT] * 4

    class ReturnsWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(3))

        def forward(self) -> torch.Tensor:
            return self.weight

    holder = nn.Sequential(ReturnsWeight())
    watcher = ActivationWatcher(holder)
    with watcher.armed_for_step(0):
        holder[0]().sum().backward()
    # A hook on a leaf would outlive the step; the parameter's .grad is where its gradient is judged.
    assert holder[0].weight._backward_hooks is None or len(holder[0].weight._backward_hooks) == 0
    assert [r.direction for r in watcher.records] == [FORWARD_OUTPUT]


# -- names -----------------------------------------------------------------------------------------------


def test_names_strip_compile_and_data_parallel_wrappers_only():
    model = GradBombNet()
    expected = ["inp", "act", "bomb", "out"]
    assert list(module_names(model).values()) == expected
    assert list(module_names(torch.compile(model)).values()) == expected
    assert list(module_names(nn.DataParallel(model)).values()) == expected

    class Holder(nn.Module):  # a user's own submodule called "module" keeps its name
        def __init__(self) -> None:
            super().__init__()
            self.module = nn.Linear(2, 2)

    assert list(module_names(Holder()).values()) == ["module"]

    outer = nn.Sequential(nn.Linear(2, 2))
    outer.append(torch.compile(nn.Sequential(nn.ReLU(), nn.Linear(2, 2))))
    names = module_names(outer)
    assert list(names.values()) == ["0", "1", "1.0", "1.1"]
    assert names[outer[1]] == "1"  # the wrapper, not its inner module, keeps the shared name


def test_names_under_distributed_data_parallel(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, init_method=f"file://{tmp_path / 'rendezvous'}")
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(SmallCNN(poison=True))
        watcher = ActivationWatcher(ddp)
        with watcher.armed_for_step(2):
            ddp(torch.randn(2, 3, 8, 8)).sum().backward()
        finding = watcher.first_finding()
        assert finding is not None and finding.module == "features.3"
    finally:
        dist.destroy_process_group()


def test_explicit_names_watch_only_those_modules():
    torch.manual_seed(0)
    model = SmallCNN(poison=True)
    watcher = ActivationWatcher(model, names={model.head: "classifier", model.features[0]: "stem"})
    with watcher.armed_for_step(0):
        model(torch.randn(2, 3, 8, 8)).sum().backward()
    assert {r.module for r in watcher.records} == {"stem", "classifier"}
    finding = watcher.first_finding()
    assert finding is not None and (finding.module, finding.problem) == ("classifier", "non-finite")


# -- findings and arming ---------------------------------------------------------------------------------


def test_finding_text():
    over = ActivationFinding("blocks.3.mlp.fc2", FORWARD_OUTPUT, "overflowed fp16", 71234.0, 0, 9, 1234)
    assert str(over) == "blocks.3.mlp.fc2: forward output overflowed fp16, amax 7.1e+04, step 1234"
    bad = ActivationFinding("blocks.3.mlp.fc2", OUTPUT_GRADIENT, "non-finite", 3.0, 12, 0, 1234)
    assert str(bad) == "blocks.3.mlp.fc2: output gradient went non-finite (12 NaN/Inf), step 1234"
    no_step = ActivationFinding("fc", FORWARD_OUTPUT, "overflowed bf16", 1e39, 0, 1, None)
    assert str(no_step) == "fc: forward output overflowed bf16, amax 1.0e+39"


def test_arm_is_idempotent_and_context_keeps_an_already_armed_watcher_armed():
    model = GradBombNet()
    watcher = ActivationWatcher(model)
    watcher.arm()
    watcher.arm()
    assert all_hooks(model) == 4
    with watcher.armed_for_step(1):
        model(torch.randn(2, 4))
    assert watcher.armed and watcher.step == 1
    watcher.disarm()
    assert all_hooks(model) == 0
    with watcher.armed_for_step(2):
        assert watcher.armed
    assert not watcher.armed


def test_new_step_clears_records():
    model = SmallCNN(poison=True)
    watcher = ActivationWatcher(model)
    with watcher.armed_for_step(1):
        model(torch.randn(2, 3, 8, 8))
    assert watcher.first_finding() is not None
    watcher.new_step(2)
    assert watcher.records == [] and watcher.first_finding() is None


def test_unknown_format_is_rejected():
    with pytest.raises(ValueError, match="unknown format"):
        ActivationWatcher(nn.Linear(2, 2), formats=("fp12",))


# ---- issue 10, cases 12 and 13: model copies, bounded records, check() after detach() ----


def _watch_hooks(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


class Spiky(nn.Module):
    """Linear whose output overflows fp16 while ``spike`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.out = nn.Linear(4, 1)
        self.spike = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return self.out(h * 1e6 if self.spike else h)


@pytest.mark.parametrize("how", ["deepcopy", "averaged_model"])
def test_a_copy_of_an_armed_model_feeds_no_inspector(how: str) -> None:
    import amp_inspect

    model = Spiky()
    insp = amp_inspect.attach(model, activations="always")
    watcher = insp._arming.watcher
    ema = copy.deepcopy(model) if how == "deepcopy" else torch.optim.swa_utils.AveragedModel(model)
    x = torch.randn(2, 4)
    watcher.new_step(0)
    for _ in range(20):
        ema(x)  # EMA / evaluation forwards of the copy: not the watched model
    assert watcher.records == []
    model(x)
    assert {r.module for r in watcher.records} == {"lin", "out"}
    insp.detach()
    assert _watch_hooks(model) == 0
    before = len(watcher.records)
    for _ in range(20):
        ema(x)
        model(x)
    assert len(watcher.records) == before  # hooks of a detached inspector do nothing, wherever they are


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_records_while_armed_are_bounded_and_keep_the_first_finding(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    # bf16 outputs: judged against fp16 (a float32 output outside autocast is not; see test_diagnosis.py).
    model = Spiky().to(device, torch.bfloat16)
    watcher = ActivationWatcher(model)
    monkeypatch.setattr(watcher, "max_records", 16, raising=False)
    x = torch.randn(2, 4, device=device, dtype=torch.bfloat16)
    with watcher.armed_for_step(0), torch.no_grad():
        for i in range(500):  # evaluation forwards while armed
            model.spike = i == 100
            model(x)
            assert len(watcher.records) < 16 * 2
    finding = watcher.first_finding()
    assert finding is not None and finding.module == "out" and finding.problem == "overflowed fp16"
    assert finding.direction == FORWARD_OUTPUT


def test_check_after_detach_does_not_rearm_hooks_on_a_skipped_step() -> None:
    import amp_inspect

    model = Spiky()
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    insp = amp_inspect.attach(model, scaler)
    insp.detach()
    model(torch.randn(2, 4)).sum().backward()
    model.out.weight.grad[0, 0] = math.nan
    report = insp.check()
    assert report.found_inf
    insp.history  # noqa: B018  # finalizes the report: a skip arms the hooks of an attached inspector
    assert _watch_hooks(model) == 0


def test_an_armed_model_can_be_saved_whole_and_the_copy_feeds_nobody(tmp_path) -> None:
    # torch.save(model) pickles the forward hooks: while armed (after a skip) that failed on the local closure.
    import amp_inspect

    model = Spiky()
    insp = amp_inspect.attach(model, activations="always")
    torch.save(model, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    insp._arming.watcher.new_step(0)
    loaded(torch.randn(2, 4))
    assert insp._arming.watcher.records == []
    insp.detach()
