"""``python -m amp_inspect.demo`` (``make demo``): the stats table of a small model's gradients.

A small GPT-style model takes a few training steps under mixed precision (bf16 autocast on CPU, fp16 on a
GPU) with a loss scale of 2^16, as GradScaler would use. Two layers are set up to be in trouble, the way
real runs get there: one block's MLP output is damped (its weight gradients drift towards fp16's subnormal
range), and the attention logits of another are amplified (their gradients overflow fp16 once scaled).
One fused tensor_stats pass over all gradients then shows, per parameter, what fp16 would make of them;
the same pass is timed against the per-parameter Python checks people write today.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from .baselines import per_tensor_checks
from .stats import tensor_stats
from .table import format_stats_table

LOSS_SCALE = 2.0**16


class Block(nn.Module):
    def __init__(self, d: int, heads: int, logit_gain: float = 1.0, mlp_gain: float = 1.0) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.logit_gain = logit_gain  # >1 amplifies attention logits: the classic fp16 overflow
        self.mlp_gain = mlp_gain  # <1 damps the MLP branch: its gradients shrink towards underflow

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).unbind(2)
        logits = torch.einsum("bqhd,bkhd->bhqk", q, k) * (self.logit_gain / (d // self.heads) ** 0.5)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attn = logits.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj(torch.einsum("bhqk,bkhd->bqhd", attn, v).reshape(b, t, d))
        return x + self.mlp_gain * self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 512, d: int = 128, layers: int = 4, heads: int = 4, context: int = 64) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        gains = [dict() for _ in range(layers)]
        gains[1] = {"mlp_gain": 1e-5}
        gains[layers - 1] = {"logit_gain": 30000.0}
        self.blocks = nn.ModuleList(Block(d, heads, **g) for g in gains)
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="training steps before the inspection")
    parser.add_argument("--all", action="store_true", help="list every parameter, not only those in trouble")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp_dtype = torch.float16 if device == "cuda" else torch.bfloat16
    model = TinyGPT().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    names = [n for n, _ in model.named_parameters()]
    numel = sum(p.numel() for p in model.parameters())
    print(f"amp_inspect demo: TinyGPT, {numel:,} parameters in {len(names)} tensors")
    print(f"device {device}, autocast {amp_dtype}, loss scale 2^16, gradients judged against fp16\n")

    for step in range(args.steps):
        idx = torch.randint(0, 512, (8, 64), device=device)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=amp_dtype):
            logits = model(idx[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        (loss * LOSS_SCALE).backward()
        if step < args.steps - 1:
            for p in model.parameters():  # unscale and step, as GradScaler would on a clean step
                p.grad.div_(LOSS_SCALE)
            opt.step()

    grads = [p.grad for p in model.parameters()]
    stats = tensor_stats(grads, formats=("fp16", "bf16"))
    title = "every parameter" if args.all else "parameters in trouble"
    print(f"Scaled gradients, {title} (fp16 view):")
    print(format_stats_table(stats, names, "fp16", only_trouble=not args.all))
    total = stats.numel.sum().item()
    print(
        f"\nAll {len(names)} tensors, {total:,} values: NaN {stats.nan.sum().item()}, "
        f"Inf {(stats.posinf + stats.neginf).sum().item()}, "
        f"fp16 overflow {stats.overflow[:, 0].sum().item()}, subnormal {stats.subnormal[:, 0].sum().item()}, "
        f"underflow {stats.underflow[:, 0].sum().item()}; bf16 overflow {stats.overflow[:, 1].sum().item()}, "
        f"underflow {stats.underflow[:, 1].sum().item()}"
    )

    def timed(fn, repeats: int = 5) -> float:
        times = []
        for _ in range(repeats):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]

    fused = timed(lambda: tensor_stats(grads, formats=("fp16", "bf16")).nan.sum().item())
    loops = timed(lambda: per_tensor_checks(grads))
    print(
        f"\nOne fused pass: {fused * 1e3:.2f} ms; per-parameter Python checks (10 .item() per tensor): "
        f"{loops * 1e3:.1f} ms ({loops / fused:.0f}x slower, and no exponent histogram or bf16 column)."
    )


if __name__ == "__main__":
    main()
