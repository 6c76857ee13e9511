"""Loss-scaler benchmark: torch.amp.GradScaler against InspectingGradScaler(policy="headroom"), same seeds.

CPU only, as the demo runs: bf16 autocast, and every parameter gradient rounded through fp16 after backward
(``p.grad.copy_(p.grad.to(float16))``, as in amp_inspect/cli/demo.py), so scaled gradients past 65504 become Inf
and those below 2^-25 become zero, as fp16 gradients would. Models (models.small_model, small for a shared
2-core machine): ``gpt``, the demo's TinyGPT, and ``gpt2``, a transformers GPT-2 from a config, on sequences
that count up by one modulo the vocabulary from a random start (learnable: the loss falls); ``cnn``, two conv
layers and a linear head on 3x16x16 images whose class sets the mean of one channel.

Scenarios, each in its own run: ``clean``; ``spike`` (the loss of one batch, step SPIKE_STEP, x1e4); ``nan``
(3 NaN losses at steps NAN_STEPS). Both scalers use GradScaler's defaults except growth_interval=50 (runs are
short): init_scale 2^16, growth_factor 2, backoff_factor 0.5. Adam, lr 1e-3. Seeds 0..SEEDS-1.

Per run:
- skipped steps by kind, each skip counted once, in this order:
  ``warmup``: the skips before the first applied step;
  ``spike``: a skip at the planted spike step; ``nan``: a skip at a planted NaN step;
  ``growth``: a skip at a step that ran at a higher scale than the step before (the scaler had just raised it);
  ``other``: every other skip (the scale did not rise: the gradients grew into it);
- ``underflow_fraction``: the fraction of nonzero gradients that fp16 rounds to zero at the scale used (mean over
  applied steps; also without step 0, and over the 20 applied steps before and after the event);
- ``mean_log2_scale``: the mean of log2(scale) from the first applied step on: the scale the policy ran at;
- after an event: the factor the scale fell below the scale of the event's step, and the steps from the event's
  last step until the scale is back within 2x of it (0 when it never fell below half; None: not in the run);
- ``final_loss``: the mean of the last 10 losses.

The table sums or averages over seeds; ``±`` is the seed-to-seed spread (population standard deviation over the
seeds). The issue's targets are printed as PASS/MISS lines.

Run:  python bench/bench_scaler.py [--steps 200] [--seeds 3] [--models gpt,gpt2,cnn] [--out bench/results]
      python bench/bench_scaler.py --quick                                # smoke test: gpt, 1 seed, no JSON
      python bench/bench_scaler.py --table bench/results/scaler_cpu.json   # the table of a results file
Writes bench/results/scaler_cpu.json (--quick: only with --out, as scaler_cpu_quick.json) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

# Run from a checkout without installing: the package one folder up, harness and models beside this file.
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import (  # noqa: E402
    RESULTS_DIR,
    TargetCheck,
    load_average,
    machine_info,
    print_checks,
    print_table,
    write_result,  # noqa: E402
)
from models import SMALL_CONTEXT, SMALL_MODELS, SMALL_VOCAB, small_model  # noqa: E402

import amp_inspect  # noqa: E402

BATCH = 8
SPIKE_STEP = 120
NAN_STEPS = (120, 121, 122)
GROWTH_INTERVAL = 50
SCENARIOS = ("clean", "spike", "nan")
SCALERS = ("gradscaler", "headroom")
SKIP_KINDS = ("warmup", "growth", "spike", "nan", "other")
PLANTED = ("spike", "nan")
WINDOW = 20  # steps before and after an event for its underflow fractions


def loss_of(kind: str, model: nn.Module, step: int, seed: int) -> torch.Tensor:
    """The loss of step ``step``'s batch, drawn from (seed, step): every scaler sees the same batches."""
    g = torch.Generator().manual_seed(seed * 100_000 + step)
    if kind == "cnn":
        labels = torch.randint(0, 10, (BATCH,), generator=g)
        x = torch.randn(BATCH, 3, 16, 16, generator=g)
        x[:, 0] += labels.view(-1, 1, 1).float() / 5
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        return nn.functional.cross_entropy(out.float(), labels)
    start = torch.randint(0, SMALL_VOCAB, (BATCH, 1), generator=g)
    idx = (start + torch.arange(SMALL_CONTEXT + 1)) % SMALL_VOCAB
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(idx[:, :-1])
        logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits.float().flatten(0, 1), idx[:, 1:].flatten())


def run(kind: str, scaler_kind: str, scenario: str, seed: int, steps: int) -> dict:
    model = small_model(kind, seed)
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


def skip_kind(step: int, scenario: str, scales: Sequence[float], first_applied: int) -> str:
    """The kind of a skip at ``step`` (see the module docstring)."""
    if step < first_applied:
        return "warmup"
    if scenario == "spike" and step == SPIKE_STEP:
        return "spike"
    if scenario == "nan" and step in NAN_STEPS:
        return "nan"
    if step > 0 and scales[step] > scales[step - 1]:
        return "growth"
    return "other"


def summarize(scenario: str, scales: list, skipped: list, losses: list, underflow: list) -> dict:
    steps = len(scales)
    first_applied = next((i for i, s in enumerate(skipped) if not s), steps)
    skipped_at = [[i, skip_kind(i, scenario, scales, first_applied)] for i, s in enumerate(skipped) if s]
    kinds = {k: sum(kind == k for _, kind in skipped_at) for k in SKIP_KINDS}
    applied = [u for u in underflow if u is not None]
    out = {
        "skipped": kinds,
        "skipped_total": len(skipped_at),
        "skipped_at": skipped_at,
        "underflow_fraction": statistics.fmean(applied) if applied else None,
        "underflow_fraction_after_step0": _mean(underflow[1:]),
        "mean_log2_scale": statistics.fmean(math.log2(s) for s in scales[first_applied:]),
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
            underflow_before=_mean(underflow[event - WINDOW : event]),
            underflow_after=_mean(underflow[last + 1 : last + 1 + WINDOW]),
        )
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def grouped(runs: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    """Runs by (model, scenario, scaler), seeds in order."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in sorted(runs, key=lambda r: r["seed"]):
        groups.setdefault((r["model"], r["scenario"], r["scaler"]), []).append(r)
    return groups


def print_runs(runs: list[dict]) -> None:
    headers = ["model", "scenario", "scaler", "skips w/g/s/n/o", "underflow ± seeds", "(after 0)", "log2 scale"]
    headers += ["lost", "recover", "final loss ± seeds"]
    rows = []
    for (model, scenario, scaler), group in grouped(runs).items():
        under = [r["underflow_fraction"] for r in group]
        losses = [r["final_loss"] for r in group]
        recovered = [r.get("steps_to_recover") for r in group]
        rows.append(
            [model, scenario, scaler, "/".join(str(sum(r["skipped"].get(k, 0) for r in group)) for k in SKIP_KINDS)]
            + [f"{statistics.fmean(under):.2e}±{statistics.pstdev(under):.1e}"]
            + [f"{statistics.fmean(r['underflow_fraction_after_step0'] for r in group):.2e}"]
            + [f"{statistics.fmean(r['mean_log2_scale'] for r in group):.2f}"]
            + ["-" if scenario == "clean" else f"{max(r['lost_factor'] for r in group):g}x"]
            + ["-" if scenario == "clean" else "never" if None in recovered else str(max(recovered))]
            + [f"{statistics.fmean(losses):.4f}±{statistics.pstdev(losses):.4f}"]
        )
    print_table(headers, rows)


def check_targets(runs: list[dict]) -> list[TargetCheck]:
    """The issue's targets, headroom against GradScaler on the same seeds. Skips at the planted events are
    unavoidable for both scalers; "avoidable" skips are warm-up, growth and other."""
    groups = grouped(runs)
    mine = [r for r in runs if r["scaler"] == "headroom"]
    checks = [TargetCheck("zero warm-up skips", all(r["skipped"]["warmup"] == 0 for r in mine), _skips(mine))]
    gs = [r for r in runs if r["scaler"] == "gradscaler"]
    avoidable = [sum(r["skipped"].get(k, 0) for k in ("warmup", "growth", "other")) for r in (mine, gs) for r in r]
    mine_avoid, gs_avoid = sum(avoidable[: len(mine)]), sum(avoidable[len(mine) :])
    detail = f"avoidable skips {mine_avoid} vs GradScaler's {gs_avoid}; all skips {_total(mine)} vs {_total(gs)}"
    checks.append(TargetCheck("at most half of GradScaler's skips over all runs", 2 * mine_avoid <= gs_avoid, detail))
    worse = [
        f"{m['model']}/{m['scenario']}/seed {m['seed']}: {m['skipped_total']} vs {g['skipped_total']}"
        for (model, scenario, scaler), group in groups.items()
        if scaler == "headroom"
        for m, g in zip(group, groups[(model, scenario, "gradscaler")], strict=True)
        if m["skipped_total"] > g["skipped_total"]
    ]
    checks.append(TargetCheck("never more skips than GradScaler on any run", not worse, "; ".join(worse) or "none"))
    for (model, scenario, scaler), group in groups.items():
        if scaler != "headroom":
            continue
        theirs = groups[(model, scenario, "gradscaler")]
        name = f"{model}/{scenario}"
        if scenario == "nan":
            lost = max(r["lost_factor"] for r in group)
            detail = f"{lost:g}x (GradScaler {max(r['lost_factor'] for r in theirs):g}x)"
            checks.append(TargetCheck(f"{name}: scale within 4x after the NaN burst", lost <= 4, detail))
            pairs = [(r["underflow_before"] or 0.0, r["underflow_after"] or 0.0) for r in group]
            ok = all(a <= b for b, a in pairs)
            gs_pairs = [(r["underflow_before"] or 0.0, r["underflow_after"] or 0.0) for r in theirs]
            detail = ", ".join(f"{b:.2e} -> {a:.2e}" for b, a in pairs) + " (GradScaler: "
            detail += ", ".join(f"{b:.2e} -> {a:.2e}" for b, a in gs_pairs) + ")"
            checks.append(TargetCheck(f"{name}: no more underflow after the burst than before", ok, detail))
        if scenario == "spike":
            recover = [r["steps_to_recover"] for r in group]
            ok = None not in recover and max(recover) <= 10
            checks.append(TargetCheck(f"{name}: back within 2x in <= 10 steps", ok, f"steps {recover}"))
        under = statistics.fmean(r["underflow_fraction"] for r in group)
        under_gs = statistics.fmean(r["underflow_fraction"] for r in theirs)
        spread = statistics.pstdev(r["underflow_fraction"] for r in theirs)
        after0 = [statistics.fmean(r["underflow_fraction_after_step0"] for r in runs) for runs in (group, theirs)]
        detail = (
            f"{under:.3e} vs {under_gs:.3e} (GradScaler's seed-to-seed spread ±{spread:.1e}; "
            f"after step 0: {after0[0]:.3e} vs {after0[1]:.3e})"
        )
        checks.append(TargetCheck(f"{name}: underflow fraction <= GradScaler's", under <= under_gs, detail))
        diffs = [m["final_loss"] - g["final_loss"] for m, g in zip(group, theirs, strict=True)]
        spread = statistics.pstdev(g["final_loss"] for g in theirs)
        detail = f"headroom - GradScaler {statistics.fmean(diffs):+.4f} (per seed), seed-to-seed spread {spread:.4f}"
        ok = statistics.fmean(diffs) <= spread
        checks.append(TargetCheck(f"{name}: final loss no worse than GradScaler's beyond the spread", ok, detail))
    return checks


def _skips(runs: list[dict]) -> str:
    return "warm-up skips " + str(sum(r["skipped"]["warmup"] for r in runs)) + f" in {len(runs)} runs"


def _total(runs: list[dict]) -> int:
    return sum(r["skipped_total"] for r in runs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default 200; quick: 140)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per configuration (default 3; quick: 1)")
    parser.add_argument("--models", default=None, help=f"comma-separated, of {','.join(SMALL_MODELS)} (quick: gpt)")
    parser.add_argument("--quick", action="store_true", help="smoke test: gpt, 1 seed, 140 steps, no JSON")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON folder (default {RESULTS_DIR}; quick: none)")
    parser.add_argument("--table", type=Path, help="print the table of a results file and exit")
    args = parser.parse_args(argv)
    if args.table is not None:
        runs = json.loads(args.table.read_text())["runs"]
        print_runs(runs)
        print()
        print_checks(check_targets(runs))
        return 0
    steps = args.steps or (140 if args.quick else 200)
    seeds = args.seeds or (1 if args.quick else 3)
    models = (args.models or ("gpt" if args.quick else ",".join(SMALL_MODELS))).split(",")
    if steps <= NAN_STEPS[-1] + 1:
        parser.error(
            f"--steps must be more than {NAN_STEPS[-1] + 1}: the events are at steps {SPIKE_STEP}-{NAN_STEPS[-1]}"
        )
    out_dir = args.out if args.out is not None or args.quick else RESULTS_DIR
    torch.set_num_threads(1)
    machine = machine_info("cpu")
    results = []
    start = time.perf_counter()
    for kind in models:
        for scenario in SCENARIOS:
            for seed in range(seeds):
                for scaler_kind in SCALERS:
                    r = run(kind, scaler_kind, scenario, seed, steps)
                    r.update(model=kind, scaler=scaler_kind, scenario=scenario, seed=seed)
                    results.append(r)
                    print(json.dumps({k: v for k, v in r.items() if k != "skipped_at"}), flush=True)
    machine["load_average_after"] = load_average()
    checks = check_targets(results)
    payload = {
        "machine": machine,
        "steps": steps,
        "seeds": seeds,
        "growth_interval": GROWTH_INTERVAL,
        "spike_step": SPIKE_STEP,
        "nan_steps": list(NAN_STEPS),
        "seconds": round(time.perf_counter() - start, 1),
        "targets": [c.__dict__ for c in checks],
        "runs": results,
    }
    print()
    print_runs(results)
    print()
    print_checks(checks)
    if out_dir is not None:
        write_result(payload, out_dir, "scaler_cpu", args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
