"""Loss-scaler benchmark: torch.amp.GradScaler against InspectingGradScaler(policy="headroom"), same seeds.

CPU only, as the demo runs: bf16 autocast, and every parameter gradient rounded through fp16 after backward
(``p.grad.copy_(p.grad.to(float16))``, as in amp_inspect/demo.py), so scaled gradients past 65504 become Inf
and those below 2^-25 become zero, as fp16 gradients would. Models (small, for a shared 2-core machine):

- ``gpt``: amp_inspect.demo.TinyGPT (d 64, 2 layers, 4 heads, its fp16-stored attention logits), on sequences
  that count up by one modulo the vocabulary from a random start (learnable: the loss falls);
- ``gpt2``: transformers GPT2LMHeadModel from a config (2 layers, d 64, 2 heads, vocab 64, 32 positions), same
  data;
- ``cnn``: two conv layers and a linear head on 3x16x16 images whose class sets the mean of one channel.

Scenarios, each in its own run: ``clean``; ``spike`` (the loss of one batch, step SPIKE_STEP, x1e4); ``nan``
(3 NaN losses at steps NAN_STEPS). Both scalers use GradScaler's defaults except growth_interval=50 (runs are
short): init_scale 2^16, growth_factor 2, backoff_factor 0.5. Adam, lr 1e-3.

Per run: skipped steps by kind (warm-up: the skips before the first applied step; spike: in the 10 steps
from the spike; nan: at the NaN steps; growth: every other skip), the fraction of nonzero gradients that fp16
rounds to zero at the scale used (mean over applied steps; and over the 20 steps before and after the event),
steps to recover within 2x of the scale used just before the event (counted from the event's last step; 0
when the scale never fell below half), the final loss (mean of the last 10 losses). Seeds 0..SEEDS-1.

Run:  python bench/bench_scaler.py [--steps 200] [--seeds 3] [--models gpt,gpt2,cnn] [--out bench/results]
      python bench/bench_scaler.py --table bench/results/scaler_cpu.json   # the table of a results file
Writes bench/results/scaler_cpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import amp_inspect  # noqa: E402
from amp_inspect.demo import TinyGPT  # noqa: E402

VOCAB, CONTEXT, BATCH = 64, 32, 8
SPIKE_STEP = 120
NAN_STEPS = (120, 121, 122)
GROWTH_INTERVAL = 50


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        return self.head(x.flatten(1))


def make_model(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "gpt":
        return TinyGPT(d=64, layers=2, heads=4, emulate_fp16=True)
    if kind == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=2)
        return GPT2LMHeadModel(config)
    return CNN()


def loss_of(kind: str, model: nn.Module, step: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100_000 + step)
    if kind == "cnn":
        labels = torch.randint(0, 10, (BATCH,), generator=g)
        x = torch.randn(BATCH, 3, 16, 16, generator=g)
        x[:, 0] += labels.view(-1, 1, 1).float() / 5
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        return nn.functional.cross_entropy(out.float(), labels)
    start = torch.randint(0, VOCAB, (BATCH, 1), generator=g)
    idx = (start + torch.arange(CONTEXT + 1)) % VOCAB
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx[:, :-1])
        logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())


def run(kind: str, scaler_kind: str, scenario: str, seed: int, steps: int) -> dict:
    model = make_model(kind, seed)
    counts = {"nonzero": 0, "underflow": 0}

    def round_through_fp16(p: torch.Tensor) -> None:
        with torch.no_grad():
            half = p.grad.to(torch.float16)
            counts["nonzero"] += int((p.grad != 0).sum())
            counts["underflow"] += int(((p.grad != 0) & (half == 0)).sum())
            p.grad.copy_(half)

    for p in model.parameters():
        p.register_post_accumulate_grad_hook(round_through_fp16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    if scaler_kind == "gradscaler":
        scaler = torch.amp.GradScaler("cpu", growth_interval=GROWTH_INTERVAL)
    else:
        scaler = amp_inspect.InspectingGradScaler("cpu", growth_interval=GROWTH_INTERVAL, policy="headroom")
    scales, skipped, losses, underflow = [], [], [], []
    for step in range(steps):
        loss = loss_of(kind, model, step, seed)
        losses.append(loss.item())
        if scenario == "spike" and step == SPIKE_STEP:
            loss = loss * 1e4
        if scenario == "nan" and step in NAN_STEPS:
            loss = loss * math.nan
        counts["nonzero"] = counts["underflow"] = 0
        scales.append(scaler.get_scale())
        scaler.scale(loss).backward()
        scaler.step(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values()) > 0
        scaler.update()
        opt.zero_grad(set_to_none=True)
        skipped.append(found)
        underflow.append(None if found else counts["underflow"] / max(counts["nonzero"], 1))
    return summarize(scenario, scales, skipped, losses, underflow)


def summarize(scenario: str, scales: list, skipped: list, losses: list, underflow: list) -> dict:
    steps = len(scales)
    first_applied = next((i for i, s in enumerate(skipped) if not s), steps)
    kinds = {"warmup": first_applied, "spike": 0, "nan": 0, "growth": 0}
    for i, s in enumerate(skipped[first_applied:], start=first_applied):
        if not s:
            continue
        if scenario == "spike" and SPIKE_STEP <= i < SPIKE_STEP + 10:
            kinds["spike"] += 1
        elif scenario == "nan" and i in NAN_STEPS:
            kinds["nan"] += 1
        else:
            kinds["growth"] += 1
    applied = [u for u in underflow if u is not None]
    out = {
        "skipped": kinds,
        "skipped_total": sum(kinds.values()),
        "underflow_fraction": statistics.fmean(applied) if applied else None,
        "underflow_fraction_after_step0": _mean(underflow[1:]),
        "final_loss": statistics.fmean(losses[-10:]),
        "final_scale": scales[-1],
    }
    if scenario != "clean":
        event, last = (SPIKE_STEP, SPIKE_STEP) if scenario == "spike" else (NAN_STEPS[0], NAN_STEPS[-1])
        before = scales[event]
        recover = next((i - last for i in range(last + 1, steps) if scales[i] >= before / 2), None)
        dropped = min(scales[event : last + 2])
        out.update(
            scale_before=before,
            lowest_scale_after=dropped,
            lost_factor=before / dropped,
            steps_to_recover=0 if dropped >= before / 2 else recover,
            underflow_before=_mean(underflow[event - 20 : event]),
            underflow_after=_mean(underflow[last + 1 : last + 21]),
        )
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--models", default="gpt,gpt2,cnn")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--table", type=Path, help="print the table of a results file and exit")
    args = parser.parse_args()
    if args.table is not None:
        print_table(json.loads(args.table.read_text())["runs"])
        return
    torch.set_num_threads(1)
    results = []
    start = time.perf_counter()
    for kind in args.models.split(","):
        for scenario in ("clean", "spike", "nan"):
            for seed in range(args.seeds):
                for scaler_kind in ("gradscaler", "headroom"):
                    r = run(kind, scaler_kind, scenario, seed, args.steps)
                    r.update(model=kind, scaler=scaler_kind, scenario=scenario, seed=seed)
                    results.append(r)
                    print(json.dumps(r), flush=True)
    payload = {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
        "1 thread",
        "steps": args.steps,
        "seeds": args.seeds,
        "growth_interval": GROWTH_INTERVAL,
        "spike_step": SPIKE_STEP,
        "nan_steps": list(NAN_STEPS),
        "seconds": round(time.perf_counter() - start, 1),
        "runs": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scaler_cpu.json").write_text(json.dumps(payload, indent=1) + "\n")
    print_table(results)


def print_table(results: list[dict]) -> None:
    print(
        f"{'model':5} {'scenario':8} {'scaler':10} {'skips w/g/s/n':>14} {'underflow':>10} {'(after 0)':>10} "
        f"{'lost':>6} {'recover':>7} {'final loss':>12}"
    )
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["model"], r["scenario"], r["scaler"]), []).append(r)
    for (model, scenario, scaler), runs in groups.items():
        skips = "/".join(str(sum(r["skipped"][k] for r in runs)) for k in ("warmup", "growth", "spike", "nan"))
        under = statistics.fmean(r["underflow_fraction"] for r in runs)
        under1 = statistics.fmean(r["underflow_fraction_after_step0"] for r in runs)
        losses = [r["final_loss"] for r in runs]
        spread = statistics.pstdev(losses)
        lost = "-" if scenario == "clean" else f"{max(r['lost_factor'] for r in runs):g}x"
        recovered = [r.get("steps_to_recover") for r in runs]
        rec = "-" if scenario == "clean" else "never" if None in recovered else str(max(recovered))
        print(
            f"{model:5} {scenario:8} {scaler:10} {skips:>14} {under:10.2e} {under1:10.2e} {lost:>6} {rec:>7} "
            f"{statistics.fmean(losses):7.4f}±{spread:.4f}"
        )


if __name__ == "__main__":
    main()
