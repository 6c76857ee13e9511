"""The benchmarks' models and their data.

- ``GPT`` (``ModelSpec``): the GPT-2-style model of bench_step.py and bench_distributed.py: pre-LayerNorm
  blocks, fused qkv, torch's SDPA, GELU MLP, tied embeddings, GPT-2 initialisation. At the default spec its
  parameters are exactly bench_tensor_stats.py's ``gpt2-style`` gradient set at context 128
  (``gpt2_style_shapes``).
- ``small_model(kind)``: the three small models of bench_scaler.py: the demo's TinyGPT, a transformers GPT-2
  built from a config, and a small CNN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # GPT-2's initialisation; residual projections get INIT_STD / sqrt(2 * layers)


@dataclass(frozen=True)
class ModelSpec:
    layers: int = 6
    d_model: int = 384
    heads: int = 6
    vocab: int = 8192
    context: int = 128
    batch: int = 4
    mlp_ratio: int = 4
    tied_embeddings: bool = True


def gpt2_style_shapes(
    layers: int = 6, d_model: int = 384, vocab: int = 8192, context: int = 256
) -> tuple[tuple[int, ...], ...]:
    """Parameter shapes of a small GPT-2 in ``model.parameters()`` order (tied lm_head: no extra tensor)."""
    d, hidden = d_model, 4 * d_model
    shapes: list[tuple[int, ...]] = [(vocab, d), (context, d)]
    for _ in range(layers):
        shapes += [(d,), (d,)]  # ln1 weight, bias
        shapes += [(3 * d, d), (3 * d,)]  # attn.qkv
        shapes += [(d, d), (d,)]  # attn.proj
        shapes += [(d,), (d,)]  # ln2 weight, bias
        shapes += [(hidden, d), (hidden,)]  # mlp.fc
        shapes += [(d, hidden), (d,)]  # mlp.proj
    shapes += [(d,), (d,)]  # ln_f weight, bias
    return tuple(shapes)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention (fused qkv, torch's SDPA) and a GELU MLP."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d = spec.d_model
        self.heads = spec.heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, spec.mlp_ratio * d)
        self.fc2 = nn.Linear(spec.mlp_ratio * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """GPT-2-style language model; the output projection is tied to the token embedding."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.wte = nn.Embedding(spec.vocab, spec.d_model)
        self.wpe = nn.Embedding(spec.context, spec.d_model)
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.layers))
        self.ln_f = nn.LayerNorm(spec.d_model)
        residual_std = INIT_STD / math.sqrt(2 * spec.layers)
        for name, param in self.named_parameters():
            if param.dim() == 2:
                nn.init.normal_(param, std=residual_std if name.endswith(("proj.weight", "fc2.weight")) else INIT_STD)
            elif name.endswith("bias"):
                nn.init.zeros_(param)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def make_gpt(spec: ModelSpec, device: str, seed: int) -> GPT:
    """The GPT with weights drawn from ``seed``; its parameters have the shapes of ``gpt2_style_shapes``."""
    torch.manual_seed(seed)
    model = GPT(spec).to(device)
    shapes = tuple(tuple(p.shape) for p in model.parameters())
    expected = gpt2_style_shapes(spec.layers, spec.d_model, spec.vocab, spec.context)
    assert shapes == expected, "the model must have the parameters of bench_tensor_stats' gpt2-style set"
    return model


def token_batches(spec: ModelSpec, count: int, seed: int, device: str = "cpu") -> list[torch.Tensor]:
    """``count`` batches of random token ids, (batch, context + 1) each: inputs are [:, :-1], targets [:, 1:].
    Drawn on the CPU from ``seed``, then moved, so every device sees the same tokens."""
    g = torch.Generator().manual_seed(seed)
    size = (spec.batch, spec.context + 1)
    return [torch.randint(spec.vocab, size, generator=g).to(device) for _ in range(count)]


def next_token_loss(model: nn.Module, idx: torch.Tensor, device: str, amp_dtype: torch.dtype) -> torch.Tensor:
    """Cross-entropy of predicting idx[:, 1:] from idx[:, :-1], the forward under autocast, the loss in fp32."""
    with torch.autocast(device, dtype=amp_dtype):
        logits = model(idx[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())


# ------------------------------------------------------------------------------ bench_scaler's small models

SMALL_VOCAB, SMALL_CONTEXT = 64, 32
SMALL_MODELS = ("gpt", "gpt2", "cnn")


class CNN(nn.Module):
    """Two conv layers and a linear head, for 3x16x16 images and 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.head(x.flatten(1))


def small_model(kind: str, seed: int) -> nn.Module:
    """``gpt``: amp_inspect.demo.TinyGPT (d 64, 2 layers, 4 heads, fp16-stored attention logits); ``gpt2``:
    transformers GPT2LMHeadModel from a config (2 layers, d 64, 2 heads, vocab 64, 32 positions); ``cnn``."""
    torch.manual_seed(seed)
    if kind == "gpt":
        from amp_inspect.demo import TinyGPT

        return TinyGPT(d=64, layers=2, heads=4, emulate_fp16=True)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=SMALL_VOCAB, n_positions=SMALL_CONTEXT, n_embd=64, n_layer=2, n_head=2)
        return GPT2LMHeadModel(config)
    if kind == "cnn":
        return CNN()
    raise ValueError(f"unknown model {kind!r}: one of {', '.join(SMALL_MODELS)}")
