"""What a user of other people's models meets (issue 10, case 8): transformers' Conv1D in the doctor's
multiple-of-8 check, peft/LoRA wrappers looked through in module names, and the over-time heatmap's step axis."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

import amp_inspect
from amp_inspect.naming import module_names, param_entries

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


# ---- the heatmap over time starts at the log's first step ----


@pytest.mark.skipif(not HAVE_MPL, reason="plots need matplotlib")
@pytest.mark.parametrize("first", [0, 7])
def test_heatmap_over_time_axis_starts_at_the_first_step(first: int) -> None:
    from amp_inspect import plots

    records = []
    for step in range(first, first + 31):
        record = {"step": step, "scale": 1024.0, "skipped": False, "total_norm": 1.0}
        record["modules"] = {
            "m": {
                "numel": 4,
                "nan": 0,
                "posinf": 0,
                "neginf": 0,
                "zero": 0,
                "overflow": 0,
                "subnormal": 0,
                "underflow": 0,
                "amax": 1.0,
                "grad_norm": 1.0,
            }
        }
        if step % 5 == 0:
            record["hist"] = {"m": {"120": 4}}
        records.append(record)
    fig = plots.heatmap_over_time(records, module="m")
    lo, hi = fig.axes[2].get_xlim()  # the zero strip carries the step axis
    assert first - 0.5 <= lo < min(r["step"] for r in records if "hist" in r)
    assert hi <= first + 30 + 0.5
    ticks = [t for t in fig.axes[2].get_xticks() if lo <= t <= hi]
    assert ticks and min(ticks) >= first


# ---- the doctor sees transformers' Conv1D ----


def _gpt2(n_embd: int = 36, vocab: int = 64):
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=n_embd, n_head=2, vocab_size=vocab, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)


def _sizes_finding(model: nn.Module):
    report = amp_inspect.doctor(model, autocast_dtype=torch.float16)
    return next((f for f in report.findings if f.code == "tensor-core-sizes"), None)


def test_doctor_flags_gpt2_conv1d_sizes() -> None:
    finding = _sizes_finding(_gpt2(n_embd=36))  # 36 and 3 * 36 = 108: not multiples of 8
    assert finding is not None
    for name in ("transformer.h.0.attn.c_attn (Conv1D nx=36, nf=108)", "transformer.h.0.mlp.c_fc (Conv1D nx=36)"):
        assert name in finding.message, finding.message
    assert "transformer.h.0.mlp.c_proj (Conv1D nf=36)" in finding.message


def test_doctor_is_quiet_on_a_gpt2_with_round_sizes() -> None:
    assert _sizes_finding(_gpt2(n_embd=32)) is None


class Conv1D(nn.Module):
    """A nanoGPT-style copy of transformers' Conv1D (weight [nx, nf])."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf, self.nx = nf, nx
        self.weight = nn.Parameter(torch.zeros(nx, nf))
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, self.nx), self.weight)


def test_doctor_flags_a_copied_conv1d_without_transformers() -> None:
    finding = _sizes_finding(nn.Sequential(Conv1D(nf=30, nx=16)))
    assert finding is not None and "0 (Conv1D nf=30)" in finding.message


# ---- peft / LoRA wrappers looked through ----


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
    assert {r.module for r in insp._watcher.records} >= {"embed", "fc", "fc.lora_A.default", "model"}
    report = insp.check()
    assert set(report.by_module) == {"embed", "fc", "fc.lora_A.default", "fc.lora_B.default", "model"}
    insp.detach()


def test_peft_lora_gpt2_names_match_the_plain_model() -> None:
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_gpt2(n_embd=32), peft.LoraConfig(r=8, target_modules=["c_attn"], fan_in_fan_out=True))
    names = {e.name for e in param_entries(model)}
    assert "transformer.h.0.attn.c_attn.weight" in names
    assert "transformer.h.0.attn.c_attn.lora_A.default.weight" in names
    assert not any(n.startswith("base_model") or "base_layer" in n for n in names)
    finding = _sizes_finding(model)  # 32-wide: nothing to report, and names without the peft prefix
    assert finding is None or "base_model" not in finding.message
