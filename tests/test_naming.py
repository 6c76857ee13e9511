"""Module names under peft's modules_to_save wrapper: the frozen original keeps the plain model's name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.model.naming import module_names, param_entries
from tests.models import hf_gpt2
from tests.test_doctor import sizes_finding


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


# ---- peft / LoRA wrappers looked through in module names ----


def _emulated_peft(base: nn.Module) -> nn.Module:
    """peft's structure and class modules (peft may not be installed): PeftModel.base_model -> LoraModel.model
    -> the user's model, each targeted Linear replaced by a LoRA layer holding base_layer, lora_A, lora_B."""

    class PeftModel(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.base_model = inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base_model(x)

    class LoraModel(nn.Module):
        def __init__(self, model: nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.model(x)

    class Linear(nn.Module):
        def __init__(self, base_layer: nn.Linear, r: int = 8) -> None:
            super().__init__()
            self.base_layer = base_layer
            self.lora_A = nn.ModuleDict({"default": nn.Linear(base_layer.in_features, r, bias=False)})
            self.lora_B = nn.ModuleDict({"default": nn.Linear(r, base_layer.out_features, bias=False)})

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base_layer(x) + self.lora_B["default"](self.lora_A["default"](x))

    PeftModel.__module__ = "peft.peft_model"
    LoraModel.__module__ = "peft.tuners.lora.model"
    Linear.__module__ = "peft.tuners.lora.layer"
    base.fc = Linear(base.fc)
    return PeftModel(LoraModel(base))


class Base(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.fc = nn.Linear(16, 8)
        self.model = nn.Linear(8, 8)  # the user's own submodule called "model" keeps its name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(self.fc(self.embed(x)))


def test_peft_wrappers_are_looked_through_emulated() -> None:
    wrapped = _emulated_peft(Base())
    modules = {e.name: e.module for e in param_entries(wrapped)}
    assert modules == {
        "embed.weight": "embed",
        "embed.bias": "embed",
        "fc.weight": "fc",
        "fc.bias": "fc",
        "fc.lora_A.default.weight": "fc.lora_A.default",
        "fc.lora_B.default.weight": "fc.lora_B.default",
        "model.weight": "model",
        "model.bias": "model",
    }
    names = set(module_names(wrapped).values())
    assert {"embed", "fc", "fc.lora_A.default", "model"} <= names
    assert not any(n.startswith("base_model") or "base_layer" in n for n in names)
    # The report names them so too, and the activation hooks watch the LoRA layer (its output is the sum).
    insp = amp_inspect.attach(wrapped, activations="always")
    wrapped(torch.randn(2, 8)).sum().backward()
    assert {r.module for r in insp._arming.watcher.records} >= {"embed", "fc", "fc.lora_A.default", "model"}
    report = insp.check()
    assert set(report.by_module) == {"embed", "fc", "fc.lora_A.default", "fc.lora_B.default", "model"}
    insp.detach()


def test_peft_lora_gpt2_names_match_the_plain_model() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(
        hf_gpt2(n_embd=32), peft.LoraConfig(r=8, target_modules=["c_attn"], fan_in_fan_out=True)
    )
    names = {e.name for e in param_entries(model)}
    assert "transformer.h.0.attn.c_attn.weight" in names
    assert "transformer.h.0.attn.c_attn.lora_A.default.weight" in names
    assert not any(n.startswith("base_model") or "base_layer" in n for n in names)
    finding = sizes_finding(model)  # 32-wide: nothing to report, and names without the peft prefix
    assert finding is None or "base_model" not in finding.message
