"""Could the demo's GPT move from bf16 to MXFP8 or NVFP4? Trains it a few steps in bf16 autocast on the CPU with
``readiness_every`` and writes a run log that ``amp-inspect readiness`` reads (docs/readiness.md walks through it).

    python examples/readiness_demo_gpt.py --steps 40 --out readiness_run.jsonl
    amp-inspect readiness readiness_run.jsonl

The model is the demo's (amp_inspect.cli.demo.TinyGPT), without the trouble the demo plants: plain next-token
training on random tokens, AdamW, no loss scaler (bf16 needs none).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import amp_inspect
from amp_inspect.cli.demo import CONTEXT, VOCAB, TinyGPT


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--readiness-every", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("readiness_run.jsonl"))
    args = parser.parse_args(argv)
    if args.out.exists():
        raise SystemExit(f"{args.out} exists; give another --out")
    torch.manual_seed(0)
    model = TinyGPT()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    insp = amp_inspect.attach(model, log=args.out, readiness_every=args.readiness_every)
    g = torch.Generator().manual_seed(0)
    for _ in range(args.steps):
        idx = torch.randint(8, VOCAB, (8, CONTEXT), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(idx[:, :-1])
            loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        loss.backward()
        insp.check()
        opt.step()
        opt.zero_grad(set_to_none=True)
    print(insp.readiness())
    insp.detach()
    print(f"log: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
