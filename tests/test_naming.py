"""Module names under peft's modules_to_save wrapper: the frozen original keeps the plain model's name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.naming import param_entries


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.fc = nn.Linear(16, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.fc(self.embed(x)))


def test_peft_modules_to_save_original_is_looked_through() -> None:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, target_modules=["fc"], modules_to_save=["head"])
    model = peft.get_peft_model(Classifier(), config)
    modules = {e.name: e.module for e in param_entries(model)}
    assert modules["head.weight"] == "head"  # the frozen original, as in the plain model
    assert modules["head.modules_to_save.default.weight"] == "head.modules_to_save.default"  # the trained copy
    assert not any("original_module" in name or name.startswith("base_model") for name in modules)
    insp = amp_inspect.attach(model)
    model(torch.randn(4, 8)).sum().backward()
    report = insp.check()
    assert set(report.by_module) == {"fc.lora_A.default", "fc.lora_B.default", "head.modules_to_save.default"}
    insp.detach()


def test_a_users_own_module_called_original_module_keeps_its_name() -> None:
    model = nn.Sequential()
    model.add_module("original_module", nn.Linear(4, 4))
    assert {e.module for e in param_entries(model)} == {"original_module"}
