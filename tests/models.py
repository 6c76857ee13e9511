"""Small real models and a training step for the Inspector tests (CPU, bf16 autocast, GradScaler("cpu")).

- ``TinyGPT``: the package's one small GPT (amp_inspect/cli/tiny_gpt.py) with the tests' options: token embedding,
  a positional table registered on the model itself (module "(model)"), pre-LN blocks with causal attention and
  a GELU MLP, final LayerNorm, and a head whose weight is tied to the embedding (one tensor under two names:
  "wte.weight" and "head.weight").
- ``SmallCNN``: Conv2d/BatchNorm2d/ReLU twice, global average pool, Linear head.
- ``SparseNet`` (a sparse embedding feeding a Linear head; ``sparse_backward`` runs it) and ``TwoLayer`` (two
  Linear layers): the inspector's edge cases (sparse gradients, scalers, threads, torch.compile, options).

``Block.mlp_gain`` scales the MLP branch: below 1 its weight gradients shrink towards fp16's subnormal and
underflow range, the way a damped residual branch gets there in real runs.

Also the oracles both test files use: each module's gradients as ``named_parameters`` names them, their fp16
counts from numpy's float16 cast, GradScaler's own skip decision, and ``poison_`` to write NaN/Inf into one
module's gradient.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from amp_inspect.cli import tiny_gpt
from tests import oracles

COUNT_FIELDS = ("numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow")
VOCAB = 64
CONTEXT = 16


class TinyGPT(tiny_gpt.TinyGPT):
    """The package's TinyGPT with the tests' options: vocab 64, context 16, a root positional parameter
    ("(model)"), the head tied to the embedding, torch's attention."""

    def __init__(self, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__(VOCAB, CONTEXT, dim, layers, heads, positions="parameter", tied=True)


# Every module that owns a parameter, under the name the Inspector gives it (tied head.weight is wte's).
GPT_PARAM_MODULES = {"(model)", "wte", "ln_f"} | {
    f"blocks.{i}.{m}" for i in range(2) for m in ("ln1", "attn.qkv", "attn.proj", "ln2", "mlp.fc1", "mlp.fc2")
}


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


CNN_PARAM_MODULES = {"conv1", "bn1", "conv2", "bn2", "fc"}


def gpt(seed: int = 0, **kwargs: int) -> TinyGPT:
    torch.manual_seed(seed)
    return TinyGPT(**kwargs)


def cnn(seed: int = 0) -> SmallCNN:
    torch.manual_seed(seed)
    return SmallCNN()


def batch_for(model: nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A deterministic batch for ``model`` at ``step`` (same data for every copy of a model)."""
    g = torch.Generator().manual_seed(1000 + step)
    if isinstance(model, SmallCNN):
        return torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)
    idx = torch.randint(0, VOCAB, (2, CONTEXT), generator=g)
    return idx, torch.randint(0, VOCAB, (2, CONTEXT), generator=g)


def forward_loss(model: nn.Module, step: int, autocast: bool = True) -> torch.Tensor:
    """The loss of ``model`` on its batch for ``step``, under bf16 autocast on the CPU."""
    inputs, targets = batch_for(model, step)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(inputs)
    return F.cross_entropy(out.float().flatten(0, -2), targets.flatten())


def backward(model: nn.Module, scaler: torch.amp.GradScaler | None, step: int) -> None:
    """Forward and (scaled) backward of one step; gradients are left in ``.grad``."""
    loss = forward_loss(model, step)
    (loss if scaler is None else scaler.scale(loss)).backward()


def grad_copies(model: nn.Module) -> list[torch.Tensor]:
    """Copies of ``model``'s parameters holding copies of their gradients: the same gradients, for torch to clip
    beside the Inspector."""
    copies = [p.detach().clone().requires_grad_() for p in model.parameters()]
    for c, p in zip(copies, model.parameters(), strict=True):
        c.grad = p.grad.clone()
    return copies


def param_of(model: nn.Module, module: str, name: str = "weight") -> nn.Parameter:
    return getattr(model.get_submodule(module), name)


# -- oracles and helpers --------------------------------------------------------------------------------


def owner(param_name: str) -> str:
    """The module of a parameter name, without amp_inspect: "blocks.1.mlp.fc2.weight" -> "blocks.1.mlp.fc2"."""
    module, _, _ = param_name.rpartition(".")
    return module or "(model)"


def grads_by_module(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Each module's gradients; ``named_parameters`` lists a tied tensor once, under its first name."""
    out: dict[str, list[torch.Tensor]] = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out.setdefault(owner(name), []).append(p.grad)
    return out


def fp16_oracle(grads: list[torch.Tensor], scale: float | None) -> dict[str, int]:
    """Counts of one module's judged gradients from numpy's float16 cast (v = g * scale, one float32 multiply)."""
    v = np.concatenate([oracles.judged_values(g, scale) for g in grads])
    counts = oracles.value_stats(v)
    classes = oracles.classify_numpy_fp16(v)
    return {**{k: counts[k] for k in oracles.FIXED_COUNTS}, **{k: int(c.sum()) for k, c in classes.items()}}


def poison_(model: nn.Module, module: str, value: float, count: int = 1) -> None:
    """Writes ``value`` into the first ``count`` elements of a module's weight gradient."""
    param_of(model, module).grad.view(-1)[:count] = value


def found_inf_of(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> bool:
    """GradScaler's own decision for this step (read between scaler.step and scaler.update)."""
    return sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0


REPO = Path(__file__).resolve().parent.parent


def cli_output(*args: str) -> str:
    """``amp-inspect ARGS`` run as a user runs it (a process of its own, this checkout's package, a wide terminal):
    what it printed, stdout then stderr."""
    result = subprocess.run(
        [sys.executable, "-m", "amp_inspect.cli.commands", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
    )
    return result.stdout + result.stderr


# ---- two small models for the inspector's edge cases: a sparse embedding, two Linear layers ----


class SparseNet(nn.Module):
    """A sparse embedding (nn.Embedding(sparse=True)) feeding a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, 4, sparse=True)
        self.head = nn.Linear(4, 1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(tokens)).sum()


class TwoLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


TOKENS = torch.tensor([1, 2, 1, 5])  # token 1 twice: an uncoalesced sparse gradient with a duplicate index
STORED = 3 * 4  # values stored by the coalesced gradient: three distinct tokens, four features


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]


def sparse_backward(model: SparseNet, scaler: torch.amp.GradScaler | None, poison: bool) -> None:
    loss = model(TOKENS.to(model.head.weight.device))
    (scaler.scale(loss) if scaler is not None else loss).backward()
    if poison:
        model.emb.weight.grad._values()[0, 0] = math.nan


def hf_gpt2(n_embd: int = 36, vocab: int = 64):
    """A one-layer transformers GPT-2 from a config (its Conv1D layers; skips without transformers)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1, n_embd=n_embd, n_head=2, vocab_size=vocab, n_positions=16, bos_token_id=0, eos_token_id=0
    )
    return transformers.GPT2LMHeadModel(config)
