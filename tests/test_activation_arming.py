"""activation_arming.ActivationArming: armed always or after a skip for arm_steps steps, torch.compile's
force_eager stance while armed on a compiled model and the stance before put back, a bypassed hook said."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from amp_inspect.probes._activation_arming import NO_FORWARD_SEEN, ActivationArming


class Owner:
    pass


def _stance() -> str:
    from torch._dynamo import eval_frame  # the test reads torch's current stance: no public getter

    return eval_frame._stance.stance


def test_off_makes_no_hooks_and_always_arms_at_once() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    owner = Owner()
    off = ActivationArming(model, "off", 2, ("fp16",), owner, 0)
    assert off.watcher is None
    off.after_skip(1)
    off.end_step(1, None)  # nothing to do, no error
    always = ActivationArming(model, "always", 2, ("fp16",), owner, 0)
    assert always.watcher is not None and always.watcher.armed
    always.close()
    assert not always.watcher.armed


def test_on_skip_arms_for_arm_steps_steps_then_disarms() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    owner = Owner()
    arming = ActivationArming(model, "on_skip", 2, ("fp16",), owner, 0)
    assert not arming.watcher.armed
    arming.after_skip(1)  # step 0 skipped: armed for steps 1 and 2
    for step in (1, 2):
        assert arming.watcher.armed
        model(torch.randn(1, 2))
        arming.end_step(step + 1, None)
    assert not arming.watcher.armed


def test_a_step_without_a_forward_says_the_hooks_were_bypassed() -> None:
    model, owner = nn.Sequential(nn.Linear(2, 2)), Owner()  # the hooks leave the model when the owner goes
    arming = ActivationArming(model, "always", 2, ("fp16",), owner, 0)
    with pytest.warns(RuntimeWarning, match="saw no forward pass"):
        arming.end_step(1, None)  # armed for step 0, and no forward ran
    assert arming.take_finding(0) == NO_FORWARD_SEEN
    assert arming.take_finding(0) is None  # once
    arming.close()


def test_armed_on_a_compiled_model_runs_eagerly_and_puts_the_stance_back() -> None:
    compiled, owner = torch.compile(nn.Sequential(nn.Linear(2, 2))), Owner()
    arming = ActivationArming(compiled, "on_skip", 1, ("fp16",), owner, 0)
    before = _stance()
    arming.after_skip(1)
    assert _stance() == "force_eager"
    arming.close()
    assert _stance() == before
