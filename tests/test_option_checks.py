"""Every scaler and policy option checked where it is given; state dicts loaded whole or not at all (issue 18,
cases 8 and 9)."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch

import amp_inspect
from amp_inspect.scaling.policies import HeadroomPolicy
from amp_inspect.scaling.scaler import InspectingGradScaler
from tests.models import TwoLayer


@pytest.mark.parametrize("init_scale", [math.nan, math.inf, -1.0, 0.0, "big", True])
@pytest.mark.parametrize("policy", ["torch", "headroom"])
def test_bad_init_scale_is_one_sentence(init_scale, policy) -> None:
    """Case 8: before, "cannot convert float NaN to integer" from _clamp, or a str/float comparison error."""
    with pytest.raises(ValueError, match=r"InspectingGradScaler: init_scale must be a finite number above 0, got"):
        InspectingGradScaler("cpu", init_scale=init_scale, policy=policy)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"growth_interval": 0}, "growth_interval"), ({"growth_interval": 2.5}, "growth_interval")]
    + [({"growth_factor": math.nan}, "growth_factor"), ({"backoff_factor": "half"}, "backoff_factor")],
)
def test_bad_scaler_numbers_are_one_sentence(kwargs, name) -> None:
    with pytest.raises(ValueError, match=rf"InspectingGradScaler: {name} must be"):
        InspectingGradScaler("cpu", **kwargs)


def _scaler_after_one_step() -> tuple[InspectingGradScaler, TwoLayer]:
    model = TwoLayer()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = InspectingGradScaler("cpu", init_scale=256.0)
    scaler.scale(model(torch.randn(4, 4)).sum()).backward()
    scaler.step(opt)
    return scaler, model


@pytest.mark.parametrize("new_scale", [math.nan, math.inf, -4.0, 0.0, 1e39, "2"])
def test_a_bad_new_scale_given_to_update_is_one_sentence(new_scale) -> None:
    """Before, GradScaler filled its float32 scale with it and went on (NaN, 0, -4, Inf), or failed in fill_."""
    scaler, _ = _scaler_after_one_step()
    with pytest.raises(ValueError, match=r"InspectingGradScaler.update: new_scale must be a finite number above 0"):
        scaler.update(new_scale)
    assert scaler.get_scale() == 256.0  # nothing applied


@pytest.mark.parametrize("new_scale", [512.0, 3, torch.tensor(128.0)])
def test_a_good_new_scale_given_to_update_is_applied(new_scale) -> None:
    scaler, _ = _scaler_after_one_step()
    scaler.update(new_scale)
    assert scaler.get_scale() == float(new_scale if not isinstance(new_scale, torch.Tensor) else new_scale.item())


def test_good_scaler_options_and_positional_arguments_pass() -> None:
    scaler = InspectingGradScaler("cpu", 1024.0, 2.0, 0.5, 100, policy="headroom")
    assert scaler.state_dict()["growth_interval"] == 100


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_scale": -1.0}, "max_scale must be a finite number above 0"),
        ({"probe_scale": math.nan}, "probe_scale must be a finite number above 0"),
        ({"min_scale": 8.0, "max_scale": 4.0}, r"min_scale \(8\) is above max_scale \(4\)"),
        ({"patience": -1}, "patience must be an integer 0 or more"),
        ({"far_binades": 1.5}, "far_binades must be an integer"),
        ({"margin": 11}, "margin must be an integer from 0 to 10"),
        ({"fmt": "fp17"}, "fmt must be one of"),
    ],
)
def test_headroom_policy_options_are_checked(kwargs, match) -> None:
    """Case 9: before, max_scale=-1 gave "math domain error" later; nan, min > max and -1 passed silently."""
    with pytest.raises(ValueError, match=f"HeadroomPolicy: {match}"):
        HeadroomPolicy(**kwargs)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("fmt", "fp17", "fmt must be one of"),
        ("margin", "2", "margin must be an integer"),
        ("anchor", -4.0, "anchor must be a finite number above 0"),
        ("ref_amax", math.nan, "ref_amax must be"),
        ("calibrated", "yes", "calibrated must be True or False"),
        ("nonfinite_run", -1, "nonfinite_run must be an integer 0 or more"),
    ],
)
def test_a_bad_policy_state_loads_nothing(field, value, match) -> None:
    """Case 9: before, "fp17" a bare KeyError and "margin": "2" a TypeError inside decide(), after the scaler's
    own scale was already loaded (a partial load)."""
    saved = InspectingGradScaler("cpu", init_scale=2.0**10, policy="headroom")
    saved.scale(torch.ones(()))  # makes the scale tensor
    state = copy.deepcopy(saved.state_dict())
    state["scale"] = 2.0**5
    state["headroom_policy"][field] = value
    target = InspectingGradScaler("cpu", init_scale=2.0**10, policy="headroom")
    target.scale(torch.ones(()))
    before_scale, before_policy = target.get_scale(), copy.deepcopy(target._policy.state_dict())
    with pytest.raises(ValueError, match=f"HeadroomPolicy.load_state_dict: {match}"):
        target.load_state_dict(state)
    assert target.get_scale() == before_scale
    assert target._policy.state_dict() == before_policy


def test_a_bad_scaler_state_loads_nothing() -> None:
    target = InspectingGradScaler("cpu", init_scale=2.0**10, policy="headroom")
    target.scale(torch.ones(()))
    state = copy.deepcopy(target.state_dict())
    state["scale"], state["headroom_policy"]["margin"] = "big", 3
    with pytest.raises(ValueError, match="InspectingGradScaler.load_state_dict: scale must be"):
        target.load_state_dict(state)
    assert target._policy.margin == 2
    del state["_growth_tracker"]
    with pytest.raises(ValueError, match="lacks _growth_tracker"):
        target.load_state_dict(state)


def test_a_good_state_round_trips() -> None:
    saved = InspectingGradScaler("cpu", init_scale=2.0**10, policy="headroom")
    saved.scale(torch.ones(()))
    state = saved.state_dict()
    state["headroom_policy"]["margin"] = 4
    state["scale"] = 2.0**6
    target = InspectingGradScaler("cpu", policy="headroom")
    target.scale(torch.ones(()))
    target.load_state_dict(state)
    assert target.get_scale() == 2.0**6 and target._policy.margin == 4
    policy = HeadroomPolicy()
    policy.load_state_dict(HeadroomPolicy(fmt="bf16", margin=3).state_dict())
    assert policy.fmt == "bf16" and policy.margin == 3 and policy.ceiling == HeadroomPolicy(fmt="bf16").ceiling


def test_a_headroom_state_loaded_into_a_torch_policy_scaler_says_so() -> None:
    """Like case 9: before, the policy's state was dropped without a word."""
    saved = InspectingGradScaler("cpu", init_scale=2.0**10, policy="headroom")
    saved.scale(torch.ones(()))
    target = InspectingGradScaler("cpu")
    target.scale(torch.ones(()))
    with pytest.warns(RuntimeWarning, match="saved under policy='headroom'"):
        target.load_state_dict(saved.state_dict())
    plain = InspectingGradScaler("cpu")
    plain.scale(torch.ones(()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target.load_state_dict(plain.state_dict())  # a torch-policy state: nothing to say


# ---- attach options checked at attach ----


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"hist_every": "x"}, ValueError, "hist_every must be an int"),
        ({"hist_every": 2.5}, ValueError, "hist_every must be an int"),
        ({"watch_clipping": "yes", "scaler": torch.amp.GradScaler("cpu")}, TypeError, "watch_clipping must be True"),
        ({"ddp_hook": 1}, TypeError, "ddp_hook must be True or False"),
        ({"log_all_ranks": None}, TypeError, "log_all_ranks must be True or False"),
        ({"log": 3}, TypeError, "log must be a path"),
    ],
)
def test_attach_options_are_checked_at_attach(kwargs, error, match, tmp_path) -> None:
    scaler = kwargs.pop("scaler", None)
    with pytest.raises(error, match=match):
        amp_inspect.attach(TwoLayer(), scaler, **kwargs)


@pytest.mark.parametrize(("name", "value"), [("arm_steps", 0), ("collapse_skips", "5")])
def test_inspector_only_options_are_checked_too(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        amp_inspect.Inspector(TwoLayer(), **{name: value})
