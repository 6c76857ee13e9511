"""The headroom loss-scale policy (amp_inspect/scaling/policies.py): decisions on planted statistics, and
InspectingGradScaler(policy="headroom") on the CPU loop of the demo (bf16 autocast, gradients rounded through
fp16): no warm-up skips, a NaN burst that does not collapse the scale, a spike recovered in one step,
state_dict round trips, decisions in the run log."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

import amp_inspect
from amp_inspect.scaling.policies import (
    HEADROOM,
    MARGIN,
    NO_DATA,
    NONFINITE_NOT_FROM_SCALE,
    OVERFLOW,
    SKIP_NONFINITE,
    SKIP_OVERFLOW,
    START,
    HeadroomPolicy,
    RunFacts,
    ScaleDecision,
    StepStats,
    policy_class,
    register_policy,
    registered_policies,
)
from tests import models
from tests.test_distributed import run_scenario

pytestmark = pytest.mark.usefixtures("one_thread")

CEILING = 65520.0  # fp16: a scaled |grad| >= this rounds to Inf


def clean(scale: float, amax_unscaled: float) -> StepStats:
    return StepStats(scale=scale, amax=amax_unscaled * scale, nan=0, inf=0)


# ---- the pure policy, on planted statistics ------------------------------------------------------------


def test_first_scale_is_the_probe_not_init_scale() -> None:
    assert HeadroomPolicy().first_scale(2.0**16) == 1.0
    assert HeadroomPolicy().first_scale(0.25) == 0.25  # a lower init_scale is kept


def test_clean_step_sets_the_scale_margin_binades_under_the_ceiling() -> None:
    policy = HeadroomPolicy(margin=2)
    d = policy.decide(clean(1.0, 1.0))  # amax 1 at scale 1: 2^15 < 65520 <= 2^16, 15 doublings of room
    assert (d.reason, d.skip, d.room, d.room_from) == (START, None, 15, "this step")
    assert d.scale == 2.0**13  # several binades at once
    assert d.scale * 1.0 * 2**2 < CEILING <= d.scale * 1.0 * 2**3
    d = policy.decide(clean(2.0**13, 1.0))
    assert (d.reason, d.scale, d.room) == (HEADROOM, 2.0**13, 2)


def test_clean_step_shrinks_before_an_overflow_without_a_skip() -> None:
    policy = HeadroomPolicy(margin=2)
    policy.decide(clean(1.0, 1.0))
    d = policy.decide(clean(2.0**13, 6.0))  # gradients grew 6x: room 0, under the margin
    assert (d.reason, d.skip, d.room) == (HEADROOM, None, 0)
    assert d.scale == 2.0**11


def test_overflow_near_the_ceiling_backs_off_to_the_margin() -> None:
    policy = HeadroomPolicy(margin=2)
    d = policy.decide(StepStats(scale=2.0**13, amax=60000.0, nan=0, inf=5, offenders=("fc",)))
    assert (d.reason, d.skip, d.room, d.margin) == (OVERFLOW, SKIP_OVERFLOW, 0, 2)
    assert d.scale == 2.0**11


def test_overflow_with_room_left_widens_the_margin_for_the_rest_of_the_run() -> None:
    policy = HeadroomPolicy(margin=2)
    policy.decide(clean(1.0, 1.0))
    # Inf while the finite gradients had 3 binades of room: something unseen is > 2^3 times larger.
    d = policy.decide(StepStats(scale=2.0**12, amax=2.0**12, nan=0, inf=1))
    assert (d.reason, d.skip, d.room, d.margin) == (MARGIN, SKIP_OVERFLOW, 3, 4)
    assert d.scale == 2.0**11
    assert policy.margin == 4
    d = policy.decide(clean(2.0**11, 1.0))  # later clean steps keep the wider margin
    assert (d.reason, d.margin, d.scale) == (HEADROOM, 4, 2.0**11)


def test_nan_burst_is_not_blamed_on_the_scale_and_the_backoff_is_bounded() -> None:
    policy = HeadroomPolicy(margin=2, nonfinite_backoff_binades=2)
    policy.decide(clean(1.0, 1.0))
    scale = 2.0**13
    policy.decide(clean(scale, 1.0))
    seen = []
    for _ in range(5):  # all gradients NaN (a NaN loss): nothing finite to measure this step
        d = policy.decide(StepStats(scale=scale, amax=0.0, nan=100, inf=0, offenders=("head", "wte")))
        assert (d.reason, d.skip, d.room_from, d.offenders) == (
            NONFINITE_NOT_FROM_SCALE,
            SKIP_NONFINITE,
            "last clean step",
            ("head", "wte"),
        )
        assert "non-finite, not explained by the measured gradients (head, wte)" in str(d)
        seen.append(d.scale)
        scale = d.scale
    assert seen == [2.0**12, 2.0**11, 2.0**11, 2.0**11, 2.0**11]  # never more than 4x below 2^13
    d = policy.decide(clean(scale, 1.0))  # the burst is over: straight back into the measured room
    assert (d.reason, d.scale) == (HEADROOM, 2.0**13)


def test_nan_with_finite_gradients_at_the_ceiling_is_an_overflow() -> None:
    policy = HeadroomPolicy(margin=2)
    d = policy.decide(StepStats(scale=2.0**13, amax=50000.0, nan=3, inf=2))
    assert (d.reason, d.skip) == (OVERFLOW, SKIP_OVERFLOW)


def test_inf_far_below_the_ceiling_is_not_from_the_scale() -> None:
    policy = HeadroomPolicy(margin=2, far_binades=8)
    d = policy.decide(StepStats(scale=1024.0, amax=1.0, nan=0, inf=1, offenders=("attn",)))  # 15 binades of room
    assert (d.reason, d.skip, d.room) == (NONFINITE_NOT_FROM_SCALE, SKIP_NONFINITE, 15)
    assert d.scale == 512.0
    assert policy.margin == 2  # not a hidden margin


def test_a_long_run_of_nonfinite_steps_is_finally_blamed_on_the_scale() -> None:
    policy = HeadroomPolicy(margin=2, patience=3)
    policy.decide(clean(1.0, 1.0))
    reasons = [policy.decide(StepStats(scale=1024.0, amax=0.0, nan=10, inf=0)).reason for _ in range(5)]
    assert reasons == [NONFINITE_NOT_FROM_SCALE] * 3 + [OVERFLOW] * 2


def test_nothing_measured_grows_as_gradscaler_and_nothing_known_backs_off() -> None:
    policy = HeadroomPolicy()
    # All-zero steps: GradScaler's pace, one growth per growth_interval of them (issue 16, case 11).
    scales = [policy.decide(StepStats(scale=4.0, amax=0.0, nan=0, inf=0), growth_interval=3).scale for _ in range(3)]
    assert scales == [4.0, 4.0, 8.0]
    d = policy.decide(StepStats(scale=4.0, amax=0.0, nan=0, inf=0), growth_interval=1)
    assert (d.reason, d.scale) == (NO_DATA, 8.0)
    d = policy.decide(StepStats(scale=4.0, amax=0.0, nan=5, inf=0))  # no clean step yet: nothing to judge by
    assert (d.reason, d.skip, d.scale) == (OVERFLOW, SKIP_OVERFLOW, 2.0)


def test_scales_stay_powers_of_two_within_bounds() -> None:
    policy = HeadroomPolicy(max_scale=2.0**20)
    assert policy.decide(clean(1.0, 1e-12)).scale == 2.0**20
    d = policy.decide(StepStats(scale=1.0, amax=60000.0, nan=0, inf=1))
    assert math.log2(d.scale) == round(math.log2(d.scale))


def test_scales_stay_within_bounds_that_are_not_powers_of_two_and_float32_holds_them() -> None:
    """Issue 31, item 15: before, the nearest power of two in binades stepped past max_scale: 2**128 (Inf in
    float32, "value cannot be converted to type float without overflow" in the scaler) for max_scale=3e38, 1024
    for max_scale=1000."""
    assert HeadroomPolicy(max_scale=3e38).decide(clean(1.0, 1e-40)).scale == 2.0**127
    assert HeadroomPolicy(max_scale=1000.0).decide(clean(1.0, 1e-12)).scale == 512.0
    assert HeadroomPolicy(min_scale=3.0).decide(StepStats(scale=4.0, amax=60000.0, nan=0, inf=1)).scale == 4.0
    assert HeadroomPolicy(max_scale=2.0**20).decide(clean(1.0, 1e-12)).scale == 2.0**20  # a power of two: itself


@pytest.mark.parametrize(
    ("option", "value"),
    [("max_scale", 2.0**200), pytest.param("max_scale", 10**400, id="max_scale-10**400")]
    + [("probe_scale", 1e39), ("min_scale", 1e-50)],
)
def test_a_scale_option_float32_cannot_hold_is_refused_where_given(option: str, value) -> None:
    """Issue 31, item 15: before, max_scale=2**200 passed and the scaler failed inside torch once the scale got
    there; 10**400 gave OverflowError ("int too large to convert to float")."""
    with pytest.raises(ValueError) as refused:
        HeadroomPolicy(**{option: value})
    assert str(refused.value) == (
        f"HeadroomPolicy: {option} must be a finite number above 0, got {value!r:.60} (a loss scale is held in "
        "float32: from 2**-126 to 3.4e+38)"
    )
    policy = HeadroomPolicy(max_scale=np.float32(2.0**127), min_scale=2**-20, probe_scale=np.int64(2))  # held: taken
    assert (policy.max_scale, policy.min_scale, policy.first_scale(2.0**16)) == (2.0**127, 2.0**-20, 2.0)
    assert type(policy.max_scale) is float


def test_a_policy_state_with_a_scale_float32_cannot_hold_loads_nothing() -> None:
    """Issue 31, item 15: before, anchor=1e39 loaded, and the bounded backoff after the next NaN step was
    computed from it."""
    state = HeadroomPolicy().state_dict()
    policy = HeadroomPolicy(margin=3)
    with pytest.raises(ValueError, match=r"^HeadroomPolicy.load_state_dict: anchor must be a finite number above 0"):
        policy.load_state_dict({**state, "anchor": 1e39})
    assert policy.anchor is None and policy.margin == 3
    policy.load_state_dict({**state, "anchor": 2.0**127})
    assert policy.anchor == 2.0**127 and policy.margin == 2


def test_policy_state_dict_round_trip_gives_the_same_decisions() -> None:
    a = HeadroomPolicy(margin=2)
    a.decide(clean(1.0, 1.0))
    a.decide(StepStats(scale=2.0**12, amax=2.0**12, nan=0, inf=1))  # margin -> 4
    a.decide(StepStats(scale=2.0**11, amax=0.0, nan=9, inf=0))  # inside a non-finite run
    b = HeadroomPolicy()
    b.load_state_dict(a.state_dict())
    assert b.margin == 4 and b.nonfinite_run == 2 and b.anchor == 2.0**12  # the run began at the overflow
    stats = [StepStats(scale=2.0**10, amax=0.0, nan=9, inf=0), clean(2.0**10, 3.0), clean(2.0**9, 0.01)]
    assert [a.decide(s) for s in stats] == [b.decide(s) for s in stats]


def test_invalid_policy_is_refused_with_a_sentence() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        amp_inspect.InspectingGradScaler("cpu", policy="smart")
    with pytest.raises(ValueError, match="margin"):
        HeadroomPolicy(margin=-1)


# ---- InspectingGradScaler(policy="headroom") on the demo's CPU loop --------------------------------------


def _round_through_fp16(param: torch.Tensor) -> None:
    with torch.no_grad():
        param.grad.copy_(param.grad.to(torch.float16))


def make(policy: str, seed: int = 0, **kwargs):
    model = models.gpt(seed)
    for p in model.parameters():
        p.register_post_accumulate_grad_hook(_round_through_fp16)  # fp16 gradients, rounded as the old CPU demo did
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if policy == "gradscaler":
        scaler = torch.amp.GradScaler("cpu", growth_interval=10, **kwargs)
    else:
        scaler = amp_inspect.InspectingGradScaler("cpu", growth_interval=10, policy=policy, **kwargs)
    return model, opt, scaler


def train(model, opt, scaler, steps: range, nan_steps=(), spike_steps=()):
    """Steps of the loop; returns [(scale the step ran at, skipped, the decision or None)]."""
    out = []
    for step in steps:
        loss = models.forward_loss(model, step)
        if step in nan_steps:
            loss = loss * math.nan
        if step in spike_steps:
            loss = loss * 1e4
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        skipped = models.found_inf_of(scaler, opt)
        scaler.update()
        opt.zero_grad()
        out.append((scale, skipped, getattr(scaler, "last_decision", None)))
    return out


def test_no_warm_up_skips_where_gradscaler_skips() -> None:
    ours = train(*make("headroom"), range(20))
    torch_run = train(*make("gradscaler"), range(20))
    assert torch_run[0][1]  # GradScaler starts at 2^16 and overflows (the contrast that makes this a test)
    assert not any(skipped for _, skipped, _ in ours)
    assert ours[0][0] == 1.0 and ours[0][2].reason == START
    assert ours[1][0] >= 2.0**10  # set from the first step's histogram, many binades at once
    assert all(d.reason == HEADROOM for _, _, d in ours[1:])


def test_nan_burst_does_not_collapse_the_scale() -> None:
    ours = train(*make("headroom"), range(20), nan_steps=(10, 11, 12))
    before = ours[9][0]
    assert [skipped for _, skipped, _ in ours[10:13]] == [True] * 3
    assert all(d.reason == NONFINITE_NOT_FROM_SCALE for _, _, d in ours[10:13])
    assert min(scale for scale, _, _ in ours[10:14]) >= before / 4
    assert ours[14][0] >= before / 2  # back in one clean step
    torch_run = train(*make("gradscaler"), range(20), nan_steps=(10, 11, 12))
    assert torch_run[13][0] == torch_run[9][0] / 8  # GradScaler lost 8x and stays there for growth_interval


def test_spike_recovers_within_two_steps() -> None:
    ours = train(*make("headroom"), range(16), spike_steps=(10,))
    before = ours[9][0]
    assert ours[10][1] and ours[10][2].reason == OVERFLOW
    assert ours[12][0] >= before / 2


def test_scaler_state_dict_round_trip_restores_scale_margin_and_run_state(tmp_path) -> None:
    model, opt, scaler = make("headroom")
    train(model, opt, scaler, range(6))
    scaler._policy.margin = 5  # as if learned
    train(model, opt, scaler, range(6, 8), nan_steps=(7,))
    state = scaler.state_dict()
    assert state["policy"] == "headroom" and state["headroom_policy"]["margin"] == 5
    path = tmp_path / "ckpt.pt"
    torch.save({"scaler": state, "model": model.state_dict(), "opt": opt.state_dict()}, path)
    ckpt = torch.load(path)
    model2, opt2, scaler2 = make("headroom")
    model2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["opt"])
    scaler2.load_state_dict(ckpt["scaler"])
    assert scaler2.get_scale() == scaler.get_scale() and scaler2._policy.state_dict() == scaler._policy.state_dict()
    a = train(model, opt, scaler, range(8, 14))
    b = train(model2, opt2, scaler2, range(8, 14))
    assert [(s, k, d) for s, k, d in a] == [(s, k, d) for s, k, d in b]
    for p, q in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_torch_policy_state_dict_is_gradscalers_and_loads_into_headroom() -> None:
    model, opt, scaler = make("torch")
    train(model, opt, scaler, range(3))
    state = scaler.state_dict()
    assert set(state) == {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}
    assert scaler.last_report.scale_decision is None
    _, _, headroom = make("headroom")
    headroom.load_state_dict(state)  # a GradScaler checkpoint resumes under the policy, at its scale
    assert headroom.get_scale() == scaler.get_scale()


def test_decisions_reach_last_report_and_the_run_log(tmp_path) -> None:
    model, opt, scaler = make("headroom")
    log = tmp_path / "run.jsonl"
    insp = amp_inspect.attach(model, scaler, log=log)
    train(model, opt, scaler, range(5), nan_steps=(3,))
    assert "headroom policy: next loss scale" in str(scaler.last_report)
    insp.close()
    records = amp_inspect.read_log(log)
    decisions = [r["scale_decision"] for r in records]
    assert [d["reason"] for d in decisions][:1] == [START]
    assert decisions[3]["reason"] == NONFINITE_NOT_FROM_SCALE and decisions[3]["skip"] == SKIP_NONFINITE
    assert decisions[3]["offenders"]  # the modules with NaN
    assert all(d["skip"] is None for i, d in enumerate(decisions) if i != 3)
    assert all(records[i + 1]["scale"] == decisions[i]["scale"] for i in range(len(records) - 1))


# ---- distributed: the same decision on every rank (gloo processes, tests/dist_scale_scenarios.py) ---------


def test_ddp_ranks_agree_on_every_decision(tmp_path) -> None:
    run_scenario("ddp_headroom", 2, tmp_path, module="tests.dist_scale_scenarios")


def test_fsdp2_ranks_agree_on_every_decision(tmp_path) -> None:
    run_scenario("fsdp2_headroom", 2, tmp_path, module="tests.dist_scale_scenarios")


def test_ranks_whose_statistics_stay_per_rank_decide_from_the_largest(tmp_path) -> None:
    run_scenario("mesh_2d_headroom", 4, tmp_path, module="tests.dist_scale_scenarios")


def test_headroom_scaler_pickles_with_its_policy_state() -> None:
    import pickle

    model, opt, scaler = make("headroom")
    train(model, opt, scaler, range(3))
    scaler._policy.margin = 4
    copy = pickle.loads(pickle.dumps(scaler))
    assert copy.policy == "headroom" and copy.get_scale() == scaler.get_scale()
    assert copy._policy.state_dict() == scaler._policy.state_dict()


def test_explicit_torch_policy_is_gradscaler_bit_for_bit() -> None:
    poison = {2: math.inf, 5: math.nan, 9: -math.inf}
    runs = []
    for scaler_kind in ("gradscaler", "torch"):
        model, opt, scaler = make(scaler_kind, init_scale=2.0**10)
        scaler.set_growth_interval(3)
        for step in range(14):
            models.backward(model, scaler, step)
            if step in poison:
                models.poison_(model, "blocks.1.mlp.fc2", poison[step])
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        runs.append((model, scaler))
    (model_t, torch_scaler), (model_i, ours) = runs
    assert ours.policy == "torch" and ours.state_dict() == torch_scaler.state_dict()
    assert ours.last_decision is None
    for p, q in zip(model_t.parameters(), model_i.parameters(), strict=True):
        assert torch.equal(p, q)


# ---- a policy of one's own: the ScalePolicy protocol ----------------------------------------------------


@register_policy
class HalveOnNonfinite:
    """The smallest policy: hold the scale on clean steps, halve it after a non-finite one."""

    name = "halve_on_nonfinite"
    reason_words = {"hold": "hold: clean step", "halve": "halved after NaN/Inf"}
    skip_words = {"nonfinite": "NaN/Inf in the gradients"}
    routine = ("hold",)

    def __init__(self) -> None:
        self.halvings = 0

    def first_scale(self, init_scale: float) -> float:
        return 2.0**8

    def decide(self, s: StepStats, growth_factor: float, backoff_factor: float, growth_interval: int):
        if s.nan or s.inf:
            self.halvings += 1
            return ScaleDecision(s.scale / 2, s.scale, "halve", "nonfinite", offenders=s.offenders)
        return ScaleDecision(s.scale, s.scale, "hold", None)

    def state_dict(self) -> dict:
        return {"halvings": self.halvings}

    def load_state_dict(self, state: dict) -> None:
        self.halvings = int(state["halvings"])

    @staticmethod
    def advice(facts: RunFacts) -> list[str]:
        halved = [step for step, d in facts.decisions if d.reason == "halve"]
        return [f"halved {len(halved)} times (first after step {halved[0]})"] if halved else []


def test_a_custom_policy_runs_the_scaler_and_names_its_decisions_in_the_log_summary_and_cli(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from amp_inspect.cli import commands as cli
    from amp_inspect.runlog.log import read_log

    model, opt, scaler = make(HalveOnNonfinite())
    assert scaler.policy == "halve_on_nonfinite" and scaler.get_scale() == 2.0**8  # its first scale
    insp = amp_inspect.attach(model, scaler, log=tmp_path / "run.jsonl")
    run = train(model, opt, scaler, range(8), nan_steps=(4,))
    summary = insp.summary()
    insp.close()
    assert [scale for scale, _, _ in run] == [2.0**8] * 5 + [2.0**7] * 3  # halved after step 4 alone
    assert [skipped for _, skipped, _ in run] == [step == 4 for step in range(8)]
    assert scaler.state_dict()["halve_on_nonfinite_policy"] == {"halvings": 1}
    decisions = [r["scale_decision"] for r in read_log(tmp_path / "run.jsonl") if "step" in r]
    assert {d["policy"] for d in decisions} == {"halve_on_nonfinite"} and len(decisions) == 8
    assert summary.policy == "halve_on_nonfinite"
    assert [(c.step, c.reason_text, c.skip_text) for c in summary.decisions] == [
        (4, "halved after NaN/Inf", "NaN/Inf in the gradients")
    ]
    assert "halved 1 times (first after step 4)" in summary.advice
    assert not [a for a in summary.advice if "backoff_factor" in a or "HeadroomPolicy" in a]  # not others' advice
    assert cli.main(["summary", str(tmp_path / "run.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "halve_on_nonfinite" in out and "halved after NaN/Inf" in out and "halved 1 times" in out

    restored = amp_inspect.InspectingGradScaler("cpu", policy="halve_on_nonfinite")  # by its registered name
    restored.load_state_dict(scaler.state_dict())
    assert restored.get_scale() == 2.0**7 and restored._policy.halvings == 1


def test_a_policy_without_a_required_method_is_refused_in_one_sentence() -> None:
    class NoDecide:
        name = "no_decide"

        def first_scale(self, init_scale: float) -> float:
            return init_scale

        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    with pytest.raises(TypeError) as refused:
        amp_inspect.InspectingGradScaler("cpu", policy=NoDecide())
    text = str(refused.value)
    assert text == (
        "InspectingGradScaler: policy NoDecide is not a ScalePolicy: it lacks decide (a ScalePolicy has name, "
        "first_scale, decide, state_dict, load_state_dict: amp_inspect/scaling/policies.py)"
    )
    with pytest.raises(TypeError, match="lacks name"):
        amp_inspect.InspectingGradScaler("cpu", policy=object())
    with pytest.raises(TypeError, match="got the class HalveOnNonfinite"):
        amp_inspect.InspectingGradScaler("cpu", policy=HalveOnNonfinite)
    amp_inspect.InspectingGradScaler("cpu", policy=HalveOnNonfinite())  # the complete one is taken


class Decides:
    """A policy whose first scale and decisions are what the test says: what a faulty policy may return."""

    name = "decides"

    def __init__(self, decision=None, first=2.0**4) -> None:
        self.decision, self.first = decision, first

    def first_scale(self, init_scale: float):
        return self.first

    def decide(self, s: StepStats, growth_factor: float, backoff_factor: float, growth_interval: int):
        return self.decision(s)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def one_step(scaler: amp_inspect.InspectingGradScaler) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize(
    "scale",
    [math.nan, 0.0, -4.0, math.inf, 1e39, pytest.param(10**400, id="10**400"), True, "16", None, Fraction(1, 2)],
)
def test_a_decided_scale_the_scaler_cannot_apply_is_refused_naming_the_policy(scale) -> None:
    """Issue 31, item 13: before, NaN, 0, -4 and Inf were applied as they were (the next steps ran at them,
    without a word), and None gave the step GradScaler's own update; 1e39 failed inside torch ("value cannot be
    converted to type float without overflow"), 10**400, True and "16" too ("'int' object has no attribute
    'device'"), a Fraction too."""
    scaler = amp_inspect.InspectingGradScaler("cpu", policy=Decides(lambda s: ScaleDecision(scale, s.scale, "x", None)))
    with pytest.raises(ValueError) as refused:
        one_step(scaler)
    assert str(refused.value) == (
        "InspectingGradScaler.update: the scale decided by policy 'decides' (Decides) must be a finite number above "
        f"0, got {scale!r:.60} (a loss scale is held in float32: from 2**-126 to 3.4e+38)"
    )
    assert (scaler.get_scale(), scaler.last_decision, scaler.steps) == (2.0**4, None, 0)  # nothing applied


@pytest.mark.parametrize("scale", [256, np.float32(64.0), np.float64(0.5), 2.0**127, 2.0**-126])
def test_a_decided_scale_float32_holds_is_applied_as_a_float(scale) -> None:
    """Issue 31, item 13's neighbours: before, the int 256 and numpy's float32 failed inside torch ("'int' object
    has no attribute 'device'", "'str' object has no attribute 'type'"), and numpy's float64 went to the log as
    such."""
    scaler = amp_inspect.InspectingGradScaler("cpu", policy=Decides(lambda s: ScaleDecision(scale, s.scale, "x", None)))
    one_step(scaler)
    assert scaler.get_scale() == float(scale) and scaler.steps == 1
    decision = scaler.last_decision
    assert (decision.scale, type(decision.scale), decision.policy) == (float(scale), float, "decides")
    assert scaler.last_report.scale_decision is decision


def test_a_decision_that_is_not_a_scale_decision_is_refused_naming_the_policy() -> None:
    """Issue 31, item 13: before, AttributeError "'float' object has no attribute 'policy'" from update()."""
    scaler = amp_inspect.InspectingGradScaler("cpu", policy=Decides(lambda s: s.scale * 2))
    with pytest.raises(TypeError) as refused:
        one_step(scaler)
    assert str(refused.value) == (
        "InspectingGradScaler.update: policy 'decides' (Decides) decided 32.0, not a ScaleDecision "
        "(amp_inspect/scaling/policies.py)"
    )
    assert (scaler.get_scale(), scaler.last_decision, scaler.steps) == (2.0**4, None, 0)


@pytest.mark.parametrize("first", [None, "big", math.nan, -1.0, 1e39])
def test_a_bad_first_scale_is_refused_naming_the_policy(first) -> None:
    """Issue 31, item 13: before, the scaler was made and its first scale() failed inside torch: "full(): argument
    'fill_value' (position 2) must be Number, not NoneType" (or ran at NaN or -1 without a word)."""
    with pytest.raises(ValueError) as refused:
        amp_inspect.InspectingGradScaler("cpu", policy=Decides(first=first))
    assert str(refused.value) == (
        "InspectingGradScaler: the first scale of policy 'decides' (Decides) must be a finite number above 0, got "
        f"{first!r} (a loss scale is held in float32: from 2**-126 to 3.4e+38)"
    )
    scaler = amp_inspect.InspectingGradScaler("cpu", policy=Decides(first=8))  # an int: taken as 8.0
    scaler.scale(torch.ones(()))
    assert scaler.get_scale() == 8.0


@pytest.fixture
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a test registers is forgotten after it."""
    from amp_inspect.scaling import policies

    monkeypatch.setattr(policies, "_REGISTRY", dict(policies._REGISTRY))


@pytest.mark.usefixtures("own_registry")
def test_register_policy_refuses_an_instance_a_class_without_the_methods_and_a_taken_name() -> None:
    """Issue 31, item 14: before, each of these was filed (a class of words alone, an instance, a class under
    'headroom', which then replaced the built-in one for every log and for policy="headroom")."""

    class WordsOnly:
        name = "words_only"
        reason_words = {"hold": "held"}

    with pytest.raises(TypeError) as refused:
        register_policy(WordsOnly)
    assert str(refused.value) == (
        "register_policy: WordsOnly is not a ScalePolicy: it lacks first_scale, decide, state_dict, load_state_dict "
        "(a ScalePolicy has name, first_scale, decide, state_dict, load_state_dict: amp_inspect/scaling/policies.py)"
    )
    with pytest.raises(TypeError, match=r"^register_policy: expected a policy class, got an instance of Decides"):
        register_policy(Decides())

    class MyHeadroom(HeadroomPolicy):
        name = "headroom"

    with pytest.raises(ValueError) as taken:
        register_policy(MyHeadroom)
    assert str(taken.value) == (
        f"register_policy: the name 'headroom' of {__name__}.{MyHeadroom.__qualname__} is taken by "
        "amp_inspect.scaling.policies.HeadroomPolicy; give the policy a name of its own"
    )
    with pytest.raises(ValueError, match="the name 'halve_on_nonfinite' of .* is taken by .*HalveOnNonfinite"):
        register_policy(type("Other", (HalveOnNonfinite,), {}))
    assert policy_class("headroom") is HeadroomPolicy and policy_class("halve_on_nonfinite") is HalveOnNonfinite
    assert "words_only" not in registered_policies() and "decides" not in registered_policies()

    defined = []
    for _ in range(2):  # the same class defined twice (a module reloaded, a notebook cell run again)

        @register_policy
        class Again(HeadroomPolicy):
            name = "again"

        defined.append(Again)
    assert policy_class("again") is defined[1] and defined[0] is not defined[1]
    assert amp_inspect.InspectingGradScaler("cpu", policy="again").policy == "again"


@pytest.mark.usefixtures("own_registry")
def test_a_policy_built_by_name_is_checked_as_a_policy_object() -> None:
    """Issue 31, item 14: before, policy="<name>" built the registered class without the protocol check given to
    a policy object: an instance without decide made a scaler that failed at its first update()."""

    @register_policy
    class LosesDecide(HeadroomPolicy):
        name = "loses_decide"

        def __init__(self) -> None:
            super().__init__()
            self.decide = None  # the instance's attribute hides its class's method

    with pytest.raises(
        TypeError, match=r"^InspectingGradScaler: policy LosesDecide is not a ScalePolicy: it lacks decide"
    ):
        amp_inspect.InspectingGradScaler("cpu", policy="loses_decide")
    assert isinstance(amp_inspect.InspectingGradScaler("cpu", policy="headroom")._policy, HeadroomPolicy)


def test_a_log_of_a_policy_unknown_here_shows_its_reasons_as_recorded_and_old_logs_read_as_headroom() -> None:
    from amp_inspect.scaling.timeline import decision_from_record, policy_of, scale_changes

    old = decision_from_record({"scale": 2.0, "previous": 4.0, "reason": OVERFLOW, "skip": SKIP_OVERFLOW})
    assert old.policy == "headroom" and policy_of([None, old]) == "headroom"
    assert scale_changes([3], [old])[0].reason_text == "overflow caused by the scale"
    unknown = decision_from_record({"scale": 2.0, "previous": 4.0, "reason": "zap", "skip": "z", "policy": "elsewhere"})
    change = scale_changes([3], [unknown])[0]
    assert policy_of([unknown]) == "elsewhere" and (change.reason_text, change.skip_text) == ("zap", "z")
