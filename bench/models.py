"""The benchmarks' models and their data.

- ``make_gpt(ModelSpec)``: the GPT-2-style model of bench_step.py and bench_distributed.py, the package's one
  small GPT (amp_inspect/cli/tiny_gpt.py: pre-LayerNorm blocks, fused qkv, torch's SDPA, GELU MLP) with tied
  embeddings and GPT-2's initialisation. At the default spec its parameters are exactly bench_tensor_stats.py's
  ``gpt2-style`` gradient set at context 128 (``gpt2_style_shapes``).
- ``billion_shapes()``: the GPU benchmarks' 1B-element set, drawn on the GPU.
- ``small_model(kind)``: the three small models of bench_scaler.py: the demo's TinyGPT, a transformers GPT-2
  built from a config, and a small CNN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from amp_inspect.cli.tiny_gpt import TinyGPT

MLP_RATIO = 4  # TinyGPT's MLP width, 4 * d_model


@dataclass(frozen=True)
class ModelSpec:
    layers: int = 6
    d_model: int = 384
    heads: int = 6
    vocab: int = 8192
    context: int = 128
    batch: int = 4
    mlp_ratio: int = MLP_RATIO  # recorded in the results; TinyGPT's is fixed
    tied_embeddings: bool = True  # gpt2_style_shapes has no separate head


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
        shapes += [(hidden, d), (hidden,)]  # mlp.fc1
        shapes += [(d, hidden), (d,)]  # mlp.fc2
    shapes += [(d,), (d,)]  # ln_f weight, bias
    return tuple(shapes)


BILLION = 10**9


def billion_shapes(tensors: int = 100) -> tuple[tuple[int, ...], ...]:
    """The GPU benchmarks' 1B-element set: ``tensors`` tensors of equal size (100 of 10M: 4 GB in float32), the
    size where a one-read pass runs at the GPU's full bandwidth. Too large to draw on the CPU and copy in a short
    run: the benchmarks draw it on the GPU."""
    return ((BILLION // tensors,),) * tensors


def make_gpt(spec: ModelSpec, device: str, seed: int) -> TinyGPT:
    """The GPT with weights drawn from ``seed``; its parameters have the shapes of ``gpt2_style_shapes``."""
    if spec.mlp_ratio != MLP_RATIO or not spec.tied_embeddings:
        raise ValueError(f"the benchmark's GPT has mlp_ratio {MLP_RATIO} and tied embeddings, got {spec}")
    torch.manual_seed(seed)
    model = TinyGPT(spec.vocab, spec.context, spec.d_model, spec.layers, spec.heads, tied=True, gpt2_init=True)
    model = model.to(device)
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


def autocast_words(amp_dtype: str) -> str:
    """How a benchmark's header names next_token_loss's ``amp_dtype``."""
    return "no autocast (float32)" if amp_dtype == "float32" else f"autocast {amp_dtype}"


def next_token_loss(model: nn.Module, idx: torch.Tensor, device: str, amp_dtype: torch.dtype) -> torch.Tensor:
    """Cross-entropy of predicting idx[:, 1:] from idx[:, :-1], the forward under autocast, the loss in fp32.
    ``amp_dtype`` float32: no autocast (for CPUs that emulate bf16 matmuls, where a bf16 step is tens of times
    slower and every overhead ratio shrinks with it)."""
    with torch.autocast(device, dtype=amp_dtype, enabled=amp_dtype != torch.float32):
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
    """``gpt``: the demo's TinyGPT (d 64, 2 layers, 4 heads, fp16-stored attention logits); ``gpt2``:
    transformers GPT2LMHeadModel from a config (2 layers, d 64, 2 heads, vocab 64, 32 positions); ``cnn``."""
    torch.manual_seed(seed)
    if kind == "gpt":
        return TinyGPT(dim=64, layers=2, heads=4, explicit_scores=True, fp16_logits=True)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=SMALL_VOCAB, n_positions=SMALL_CONTEXT, n_embd=64, n_layer=2, n_head=2)
        return GPT2LMHeadModel(config)
    if kind == "cnn":
        return CNN()
    raise ValueError(f"unknown model {kind!r}: one of {', '.join(SMALL_MODELS)}")
