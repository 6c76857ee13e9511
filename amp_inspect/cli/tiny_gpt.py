"""The one small GPT of the demo, the tests and the benchmarks (``TinyGPT``), and the options each needs.

The model: a token embedding ``wte``, positions, pre-LayerNorm blocks (``ln1``, causal self-attention ``attn``
with a fused ``qkv`` and an output ``proj``, ``ln2``, a GELU MLP ``mlp.fc1`` / ``mlp.act`` / ``mlp.fc2``), a final
``ln_f`` and a ``head``. Modules are built in that order, so a seed gives the same weights to every user of one
configuration. What differs between the users is an option, not a copy:

- ``positions``: ``"embedding"`` (``wpe``, an nn.Embedding) or ``"parameter"`` (``pos``, a parameter of the model
  itself: its module is the root, which the tests need a case of).
- ``tied``: the head's weight is the token embedding's (one tensor under two names, as in GPT-2).
- ``explicit_scores``: the attention logits q.k^T/sqrt(d) are the output of a module of their own,
  ``attn.scores`` (``AttentionScores``), whose ``gain`` can make them spike and whose output the activation hooks
  can name (the demo plants its overflow there); else torch's scaled_dot_product_attention computes them unseen.
- ``fp16_logits`` (with ``explicit_scores``): the logits are stored through fp16, as fp16 autocast stores them,
  for a run under bf16 autocast that must meet fp16's overflow (bench/models.py; the demo runs fp16 autocast).
- ``gpt2_init``: GPT-2's initialisation (normal 0.02, residual projections 0.02 / sqrt(2 * layers), zero biases)
  instead of torch's defaults.

``Block.mlp_gain`` scales the MLP branch: below 1 its weight gradients shrink towards fp16's subnormal and
underflow range, the way a damped residual branch gets there in real runs (the demo's second planted trouble).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02  # GPT-2's initialisation; residual projections get INIT_STD / sqrt(2 * layers)
POSITIONS = ("embedding", "parameter")


class AttentionScores(nn.Module):
    """q . k^T / sqrt(d), times ``gain`` (1 unless someone makes the logits spike)."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.scale = 1.0 / math.sqrt(head_dim)
        self.gain = 1.0

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bqhd,bkhd->bhqk", q, k) * (self.scale * self.gain)


class Attention(nn.Module):
    """Causal self-attention; see the module docstring for ``explicit_scores`` and ``fp16_logits``."""

    def __init__(self, dim: int, heads: int, explicit_scores: bool = False, fp16_logits: bool = False) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} must be a multiple of heads {heads}")
        if fp16_logits and not explicit_scores:
            raise ValueError("fp16_logits needs explicit_scores=True (scaled_dot_product_attention keeps its logits)")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.scores = AttentionScores(dim // heads) if explicit_scores else None
        self.proj = nn.Linear(dim, dim)
        self.fp16_logits = fp16_logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).unbind(2)  # each (b, t, heads, head_dim)
        if self.scores is None:
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(b, t, c))
        logits = self.scores(q, k)
        if self.fp16_logits:
            logits = logits.to(torch.float16).float()  # > 65504 becomes Inf, as in fp16
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attn = logits.masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype)
        return self.proj(torch.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block; ``mlp_gain`` scales the MLP branch (see the module docstring)."""

    def __init__(self, dim: int, heads: int, explicit_scores: bool = False, fp16_logits: bool = False) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, explicit_scores, fp16_logits)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)
        self.mlp_gain = 1.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp_gain * self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A GPT of ``layers`` blocks of width ``dim`` over ``vocab`` tokens and ``context`` positions; the options are
    the module docstring's. The demo picks smaller sizes of its own (amp_inspect/cli/demo.py)."""

    def __init__(
        self,
        vocab: int = 512,
        context: int = 64,
        dim: int = 128,
        layers: int = 4,
        heads: int = 4,
        *,
        positions: str = "embedding",
        tied: bool = False,
        explicit_scores: bool = False,
        fp16_logits: bool = False,
        gpt2_init: bool = False,
    ) -> None:
        super().__init__()
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got {positions!r}")
        self.wte = nn.Embedding(vocab, dim)
        if positions == "embedding":
            self.wpe = nn.Embedding(context, dim)
        else:
            self.pos = nn.Parameter(torch.randn(context, dim) * INIT_STD)  # a root parameter: module "(model)"
        self.blocks = nn.ModuleList(Block(dim, heads, explicit_scores, fp16_logits) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight
        if gpt2_init:
            self._init_as_gpt2(layers)

    def _init_as_gpt2(self, layers: int) -> None:
        residual_std = INIT_STD / math.sqrt(2 * layers)
        for name, param in self.named_parameters():  # a tied weight once, under its first name
            if param.dim() == 2:
                residual = name.endswith(("attn.proj.weight", "mlp.fc2.weight"))
                nn.init.normal_(param, std=residual_std if residual else INIT_STD)
            elif name.endswith("bias"):
                nn.init.zeros_(param)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if hasattr(self, "wpe"):
            x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        else:
            x = self.wte(idx) + self.pos[:t]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))
