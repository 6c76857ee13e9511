"""End-to-end training-step benchmark: what amp_inspect adds to a mixed-precision step of a small GPT.

The model is the ``gpt2-style`` gradient set of bench_tensor_stats.py at context 128: 6 layers, d_model 384,
6 heads, MLP 4x, vocab 8192, tied embeddings (the lm_head reuses wte.weight: 76 parameter tensors, 13.8M
elements). Batch 4 x 128 tokens of fixed random data, AdamW, GradScaler; autocast bf16 on CPU, fp16 on CUDA.
No step overflows, so GradScaler never skips and the activation hooks of ``on_skip`` are never armed.

Configurations, each with its own copy of the model (same initial weights), optimizer and scaler:

- ``bare``: torch.amp.GradScaler, no inspection (the baseline).
- ``check``: ``attach(model, scaler)`` (default activations="on_skip") and ``insp.check()`` every step.
- ``inspecting_scaler``: InspectingGradScaler, attached with ``attach(model, scaler)`` for module names and
  history; no check() (its unscale pass is the inspection).
- ``check_every10``: ``attach(model, scaler, every=10)`` and ``insp.check()`` every step.

They run interleaved in one process: a few warmup steps each, then rounds in which every configuration takes
a few steps (the order rotating each round), so drift in machine load touches all of them alike. A step is
zero_grad, forward and loss under autocast, scaled backward, check() where configured, scaler.step and
scaler.update, timed from its start to its end (CUDA synchronized at both ends). Overhead against ``bare``
is the median over rounds of (config's median step in the round / bare's median step in the round).
The passes over the gradients alone (tensor_stats, the InspectingGradScaler's unscale_stats_, GradScaler's
check, foreach_norm as the roofline proxy) are timed separately to give the inspection's share of a step.

Run:
    python bench/bench_step.py [--device cpu|cuda] [--quick] [--rounds N] [--steps-per-round N] [--out DIR]

Prints a table and PASS/MISS lines for the targets and writes bench/results/step_<device>.json
(a --quick run writes nothing unless --out is given, and then to step_<device>_quick.json).
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# Run from a checkout without installing: the package sits one folder up (bench_tensor_stats, next to this
# file, is importable because a script's own folder is sys.path[0]).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_tensor_stats import (  # noqa: E402
    RESULTS_DIR,
    SEED,
    TargetCheck,
    foreach_norm,
    fused,
    gpt2_style_shapes,
    gradscaler_check,
    machine_info,
    print_checks,
    time_calls,
    write_result,
)

import amp_inspect  # noqa: E402
from amp_inspect import _ops  # noqa: E402

BARE = "bare"
CHECK = "check"
INSPECTING_SCALER = "inspecting_scaler"
CHECK_EVERY10 = "check_every10"

# Targets (the lead's acceptance criteria): step-time overhead of a check() every step, and the
# InspectingGradScaler's step time relative to GradScaler's.
CPU_MAX_CHECK_OVERHEAD_PCT = 3.0
CUDA_MAX_CHECK_OVERHEAD_PCT = 1.0
MAX_SCALER_RATIO = 1.05

INIT_STD = 0.02  # GPT-2's initialisation; residual projections get INIT_STD / sqrt(2 * layers)
LEARNING_RATE = 3e-4
DISTINCT_BATCHES = 8  # step k of every configuration uses batch k % DISTINCT_BATCHES


# ---------------------------------------------------------------------------------------------- configs


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


@dataclass(frozen=True)
class StepConfig:
    """One way to train: ``scaler`` "torch" or "inspecting"; ``attach`` with ``every``; ``check`` each step."""

    name: str
    description: str
    scaler: str = "torch"
    attach: bool = False
    check: bool = False
    every: int = 1


CONFIGS: tuple[StepConfig, ...] = (
    StepConfig(BARE, "GradScaler, no inspection"),
    StepConfig(CHECK, "attach(model, scaler) + check() every step", attach=True, check=True),
    StepConfig(INSPECTING_SCALER, "InspectingGradScaler + attach, no check()", scaler="inspecting", attach=True),
    StepConfig(CHECK_EVERY10, "attach(model, scaler, every=10) + check()", attach=True, check=True, every=10),
)


@dataclass(frozen=True)
class BenchConfig:
    device: str
    quick: bool
    out_dir: Path | None
    amp_dtype: str
    warmup_steps: int  # per configuration, untimed
    rounds: int
    steps_per_round: int  # per configuration and round
    kernel_warmup: int
    kernel_repeats: int


@dataclass
class StepMeasurement:
    """Step times of one configuration (ms), split into phases: forward + backward, check(), and
    scaler.step + update (where the InspectingGradScaler's unscale pass runs). On CUDA the phases are read
    from CUDA events (device timeline), the step total from the host clock around synchronized ends."""

    config: str
    description: str
    step_ms: list[float]
    fwd_bwd_ms: list[float]
    check_ms: list[float]
    opt_ms: list[float]
    round_medians_ms: list[float]
    median_ms: float = 0.0
    min_ms: float = 0.0
    max_ms: float = 0.0
    q1_ms: float = 0.0
    q3_ms: float = 0.0
    check_median_ms: float = 0.0
    opt_median_ms: float = 0.0
    x_bare: float | None = None  # median step / bare's median step
    x_bare_paired: float | None = None  # median over rounds of the per-round ratio
    x_bare_paired_min: float | None = None
    x_bare_paired_max: float | None = None
    direct_ms: float | None = None  # check() + scaler.step/update beyond bare's (medians): the inspection's own time

    @property
    def overhead_pct(self) -> float | None:
        return None if self.x_bare_paired is None else (self.x_bare_paired - 1.0) * 100.0

    def __post_init__(self) -> None:
        self.median_ms = statistics.median(self.step_ms)
        self.min_ms = min(self.step_ms)
        self.max_ms = max(self.step_ms)
        if len(self.step_ms) >= 2:
            self.q1_ms, _, self.q3_ms = statistics.quantiles(self.step_ms, n=4)
        else:
            self.q1_ms = self.q3_ms = self.median_ms
        self.check_median_ms = statistics.median(self.check_ms)
        self.opt_median_ms = statistics.median(self.opt_ms)

    def compare(self, bare: StepMeasurement) -> None:
        self.x_bare = self.median_ms / bare.median_ms
        paired = [mine / theirs for mine, theirs in zip(self.round_medians_ms, bare.round_medians_ms, strict=True)]
        self.x_bare_paired = statistics.median(paired)
        self.x_bare_paired_min = min(paired)
        self.x_bare_paired_max = max(paired)
        self.direct_ms = self.check_median_ms + self.opt_median_ms - bare.check_median_ms - bare.opt_median_ms


@dataclass
class PassTiming:
    """One pass over the model's gradients, timed alone; ``share_of_step`` is against bare's median step."""

    method: str
    description: str
    median_ms: float
    min_ms: float
    share_of_step: float


@dataclass
class BenchResult:
    machine: dict[str, object]
    config: dict[str, object]
    model: dict[str, object]
    measurements: list[StepMeasurement] = field(default_factory=list)
    passes: list[PassTiming] = field(default_factory=list)
    agreement: list[TargetCheck] = field(default_factory=list)
    targets: list[TargetCheck] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- model


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


def make_model(spec: ModelSpec, device: str) -> GPT:
    torch.manual_seed(SEED)
    model = GPT(spec).to(device)
    shapes = tuple(tuple(p.shape) for p in model.parameters())
    expected = gpt2_style_shapes(spec.layers, spec.d_model, spec.vocab, spec.context)
    assert shapes == expected, "the model must have the parameters of bench_tensor_stats' gpt2-style set"
    return model


def make_batches(spec: ModelSpec, device: str) -> list[torch.Tensor]:
    """Random token ids, (batch, context + 1) each: inputs are [:, :-1], targets [:, 1:]."""
    g = torch.Generator().manual_seed(SEED + 1)
    size = (spec.batch, spec.context + 1)
    return [torch.randint(spec.vocab, size, generator=g).to(device) for _ in range(DISTINCT_BATCHES)]


# ---------------------------------------------------------------------------------------------- timing


StepTimes = tuple[float, float, float, float]  # ms: total, forward + backward, check(), scaler.step + update


class PhaseClock:
    """Marks points in a step; on CPU with the host clock, on CUDA with events (read after the step)."""

    def __init__(self, device: str) -> None:
        self.cuda = device == "cuda"
        self.marks: list[object] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def intervals_ms(self) -> list[float]:
        pairs = zip(self.marks, self.marks[1:], strict=False)
        if self.cuda:
            self.marks[-1].synchronize()
            return [a.elapsed_time(b) for a, b in pairs]
        return [(b - a) * 1e3 for a, b in pairs]


class Trainer:
    """One configuration's model, optimizer, scaler and (optional) inspector."""

    def __init__(self, spec: StepConfig, model: nn.Module, device: str, amp_dtype: torch.dtype) -> None:
        self.spec = spec
        self.device = device
        self.amp_dtype = amp_dtype
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        scaler_cls = amp_inspect.InspectingGradScaler if spec.scaler == "inspecting" else torch.amp.GradScaler
        self.scaler = scaler_cls(device)
        self.inspector = amp_inspect.attach(model, self.scaler, every=spec.every) if spec.attach else None
        self.init_scale = self.scaler.get_scale()
        self.steps = 0
        self.times: list[list[StepTimes]] = []  # one list per round

    def step(self, batches: Sequence[torch.Tensor]) -> StepTimes:
        """One training step: (total, forward + backward, check, scaler.step + update) in ms."""
        idx = batches[self.steps % len(batches)]
        self.steps += 1
        cuda = self.device == "cuda"
        clock = PhaseClock(self.device)
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        clock.mark()
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device, dtype=self.amp_dtype):
            logits = self.model(idx[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), idx[:, 1:].flatten())
        self.scaler.scale(loss).backward()
        clock.mark()
        if self.spec.check:
            assert self.inspector is not None
            self.inspector.check()
        clock.mark()
        self.scaler.step(self.opt)
        self.scaler.update()
        clock.mark()
        if cuda:
            torch.cuda.synchronize()
        total = (time.perf_counter() - start) * 1e3
        fwd_bwd, check, opt = clock.intervals_ms()
        return total, fwd_bwd, check, opt


def run_interleaved(trainers: list[Trainer], batches: list[torch.Tensor], config: BenchConfig) -> None:
    """Warmup, then ``rounds`` rounds of ``steps_per_round`` steps per trainer, the order rotating each round."""
    for _ in range(config.warmup_steps):
        for trainer in trainers:
            trainer.step(batches)
    n = len(trainers)
    for r in range(config.rounds):
        for trainer in trainers[r % n :] + trainers[: r % n]:
            trainer.times.append([trainer.step(batches) for _ in range(config.steps_per_round)])


def measurements_of(trainers: list[Trainer]) -> list[StepMeasurement]:
    rows = []
    for trainer in trainers:
        per_round = trainer.times
        steps = [s for round_steps in per_round for s in round_steps]
        rows.append(
            StepMeasurement(
                trainer.spec.name,
                trainer.spec.description,
                step_ms=[s[0] for s in steps],
                fwd_bwd_ms=[s[1] for s in steps],
                check_ms=[s[2] for s in steps],
                opt_ms=[s[3] for s in steps],
                round_medians_ms=[statistics.median(s[0] for s in round_steps) for round_steps in per_round],
            )
        )
    bare = rows[0]
    for m in rows:
        m.compare(bare)
    return rows


def unscale_stats_pass(grads: list[torch.Tensor]) -> Callable[[], object]:
    """The InspectingGradScaler's pass: statistics, NaN/Inf flag and in-place unscale (inv_scale 1 leaves the
    values as they are)."""
    found_inf = torch.zeros((), device=grads[0].device)
    inv_scale = torch.ones((), device=grads[0].device)
    return lambda: _ops.unscale_stats_op(grads, inv_scale, found_inf, ["fp16"])


PASSES: tuple[tuple[str, str, Callable[[list[torch.Tensor]], Callable[[], object]]], ...] = (
    ("tensor_stats", "amp_inspect.tensor_stats(grads): check()'s pass", fused()),
    ("unscale_stats_", "InspectingGradScaler's unscale pass (statistics + unscale)", unscale_stats_pass),
    ("gradscaler_check", "GradScaler's unscale pass (_amp_foreach_non_finite_check_and_unscale_)", gradscaler_check),
    ("foreach_norm", "torch._foreach_norm(grads): one read pass, the roofline proxy", foreach_norm),
)


def time_passes(trainer: Trainer, config: BenchConfig, bare_step_ms: float) -> list[PassTiming]:
    """The passes over the gradients of the last step, alone (the share of the step the inspection takes)."""
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    rows = []
    for name, description, prepare in PASSES:
        times = time_calls(prepare(grads), config.device, config.kernel_warmup, config.kernel_repeats)
        median = statistics.median(times)
        rows.append(PassTiming(name, description, median, min(times), median / bare_step_ms))
    return rows


# ---------------------------------------------------------------------------------------------- checks


def check_agreement(trainers: list[Trainer], device: str) -> list[TargetCheck]:
    """Same data, same weights, no skips: every configuration must end with the bare run's parameters (on
    CPU bit for bit; on CUDA, where backward kernels with atomics are not deterministic, the difference is
    only shown), and the inspecting ones must not have armed activation hooks."""
    checks = []
    bare = trainers[0]
    for trainer in trainers:
        scale = trainer.scaler.get_scale()
        skipped = scale < trainer.init_scale  # a skip halves the scale; growth needs 2000 clean steps
        detail = f"{trainer.steps} steps, final loss scale {scale:g}"
        if trainer.inspector is not None:
            history = trainer.inspector.history
            watcher = getattr(trainer.inspector, "_watcher", None)
            armed = bool(watcher is not None and watcher.armed)
            skipped = skipped or any(r.skipped for r in history) or armed
            detail += f", {len(history)} inspected, {sum(r.skipped for r in history)} skipped, hooks armed: {armed}"
        checks.append(TargetCheck(f"{trainer.spec.name}: no skipped step, no activation hooks", not skipped, detail))
    for trainer in trainers[1:]:
        diff = max(
            (a - b).abs().max().item() for a, b in zip(trainer.model.parameters(), bare.model.parameters(), strict=True)
        )
        exact = device == "cpu"
        passed = diff == 0.0 if exact else math.isfinite(diff)
        detail = f"max |difference| {diff:g}" + ("" if exact else " (CUDA: not required to be 0)")
        checks.append(TargetCheck(f"{trainer.spec.name}: final weights equal bare's", passed, detail))
    return checks


def check_targets(device: str, rows: list[StepMeasurement], passes: list[PassTiming]) -> list[TargetCheck]:
    by_name = {m.config: m for m in rows}
    share = {p.method: p.share_of_step for p in passes}
    bare = by_name[BARE]
    max_pct = CPU_MAX_CHECK_OVERHEAD_PCT if device == "cpu" else CUDA_MAX_CHECK_OVERHEAD_PCT
    checks = []
    m = by_name[CHECK]
    assert m.x_bare_paired is not None and m.x_bare_paired_min is not None and m.x_bare_paired_max is not None
    pct = (m.x_bare_paired - 1.0) * 100.0
    detail = (
        f"{pct:+.2f}% (rounds: {(m.x_bare_paired_min - 1) * 100:+.1f}% to {(m.x_bare_paired_max - 1) * 100:+.1f}%; "
        f"medians {m.median_ms:.1f} vs {bare.median_ms:.1f} ms); check() itself {m.check_median_ms:.2f} ms = "
        f"{m.check_median_ms / bare.median_ms * 100:.2f}% of a bare step, tensor_stats alone "
        f"{share['tensor_stats'] * 100:.2f}%"
    )
    checks.append(TargetCheck(f"check() every step: step overhead <= {max_pct:g}%", pct <= max_pct, detail))
    m = by_name[INSPECTING_SCALER]
    assert m.x_bare_paired is not None and m.x_bare_paired_min is not None and m.x_bare_paired_max is not None
    detail = (
        f"{m.x_bare_paired:.3f}x (rounds: {m.x_bare_paired_min:.3f}x to {m.x_bare_paired_max:.3f}x); "
        f"scaler.step + update {m.opt_median_ms:.2f} ms vs {bare.opt_median_ms:.2f} ms"
    )
    checks.append(
        TargetCheck(
            f"InspectingGradScaler step <= {MAX_SCALER_RATIO:g}x GradScaler's",
            m.x_bare_paired <= MAX_SCALER_RATIO,
            detail,
        )
    )
    return checks


# ----------------------------------------------------------------------------------------------- output


def print_table(result: BenchResult) -> None:
    """Step times in ms. ``overhead`` and ``x bare, paired``: median over rounds of the per-round ratio to bare
    (range: the rounds' extremes); ``x medians``: ratio of the overall medians; ``direct``: the inspection's own
    time (check() + scaler.step/update beyond bare's), also as % of bare's median step."""
    bare_ms = result.measurements[0].median_ms
    header = (
        f"{'config':<18} {'steps':>5} {'median':>7} {'min':>7} {'max':>7} {'IQR':>13} {'fwd+bwd':>8} "
        f"{'check()':>8} {'opt.step':>8} {'overhead':>9} {'x bare, paired [range]':>25} {'x medians':>9} "
        f"{'direct':>14}"
    )
    print(header)
    print("-" * len(header))
    for m in result.measurements:
        assert m.direct_ms is not None and m.overhead_pct is not None
        paired = f"{m.x_bare_paired:.3f} [{m.x_bare_paired_min:.3f}, {m.x_bare_paired_max:.3f}]"
        direct = f"{m.direct_ms:.2f} ({m.direct_ms / bare_ms * 100:+.1f}%)"
        print(
            f"{m.config:<18} {len(m.step_ms):>5} {m.median_ms:>7.1f} {m.min_ms:>7.1f} {m.max_ms:>7.1f} "
            f"{f'{m.q1_ms:.1f}-{m.q3_ms:.1f}':>13} {statistics.median(m.fwd_bwd_ms):>8.2f} "
            f"{m.check_median_ms:>8.2f} {m.opt_median_ms:>8.2f} {m.overhead_pct:>+8.2f}% {paired:>25} "
            f"{m.x_bare:>9.3f} {direct:>14}"
        )
    print()
    header = f"{'pass over the gradients':<24} {'ms (median)':>11} {'ms (min)':>9} {'% of bare step':>15}"
    print(header)
    print("-" * len(header))
    for p in result.passes:
        print(f"{p.method:<24} {p.median_ms:>11.3f} {p.min_ms:>9.3f} {p.share_of_step * 100:>15.2f}")


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke test: few rounds and steps, no JSON")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 20; quick: 2)")
    parser.add_argument("--steps-per-round", type=int, default=None, help="steps per config and round (default 2)")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON folder (default {RESULTS_DIR}; quick: none)")
    args = parser.parse_args(argv)
    out_dir = args.out if args.out is not None or args.quick else RESULTS_DIR
    amp_dtype = "float16" if args.device == "cuda" else "bfloat16"
    if args.quick:
        rounds, steps, warmup, kernel_warmup, kernel_repeats = 2, 2, 1, 1, 5
    else:
        rounds, steps, warmup, kernel_warmup, kernel_repeats = 20, 2, 3, 3, 30
    return BenchConfig(
        args.device,
        args.quick,
        out_dir,
        amp_dtype,
        warmup_steps=warmup,
        rounds=args.rounds or rounds,
        steps_per_round=args.steps_per_round or steps,
        kernel_warmup=kernel_warmup,
        kernel_repeats=kernel_repeats,
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    if config.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but no CUDA GPU is visible to torch (torch.cuda.is_available() is False)")
        return 2
    if not _ops.has_kernel(config.device):
        print(f"warning: amp_inspect has no compiled {config.device} kernel; the inspection runs the reference")

    spec = ModelSpec()
    base = make_model(spec, config.device)
    batches = make_batches(spec, config.device)
    amp_dtype = getattr(torch, config.amp_dtype)
    trainers = [Trainer(c, copy.deepcopy(base), config.device, amp_dtype) for c in CONFIGS]
    numel = sum(p.numel() for p in base.parameters())
    tensors = len(list(base.parameters()))
    model_info = {**asdict(spec), "parameters": numel, "parameter_tensors": tensors}
    result = BenchResult(machine_info(config.device), {k: str(v) for k, v in asdict(config).items()}, model_info)
    print(
        f"# GPT {spec.layers}x{spec.d_model}, {spec.heads} heads, vocab {spec.vocab}, context {spec.context}, "
        f"tied embeddings: {numel:,} parameters in {tensors} tensors; batch {spec.batch}x{spec.context}; "
        f"{config.device}, autocast {config.amp_dtype}, AdamW",
        flush=True,
    )
    print(
        f"# {len(CONFIGS)} configs interleaved: {config.warmup_steps} warmup steps each, then {config.rounds} rounds "
        f"x {config.steps_per_round} steps each",
        flush=True,
    )

    run_interleaved(trainers, batches, config)
    result.measurements = measurements_of(trainers)
    bare_ms = result.measurements[0].median_ms
    result.passes = time_passes(trainers[0], config, bare_ms)
    result.agreement = check_agreement(trainers, config.device)
    result.targets = check_targets(config.device, result.measurements, result.passes)
    # Load during the run, beside the load before it: high values mean the timings shared the CPUs.
    result.machine["load_average_after"] = os.getloadavg() if hasattr(os, "getloadavg") else None

    print()
    print_table(result)
    print()
    print_checks(result.agreement + result.targets)
    widest = max(
        (m.x_bare_paired_max - m.x_bare_paired_min) * 50.0  # half the rounds' range, in % of bare's step
        for m in result.measurements[1:]
        if m.x_bare_paired_max is not None and m.x_bare_paired_min is not None
    )
    if widest > (CPU_MAX_CHECK_OVERHEAD_PCT if config.device == "cpu" else CUDA_MAX_CHECK_OVERHEAD_PCT):
        print(
            f"note: the rounds' ratios to bare spread by +-{widest:.1f}%, more than the targets' margins: the machine "
            "was noisy; read the direct column and the pass table, or rerun with more --rounds on a quiet machine"
        )
    if config.out_dir is not None:
        write_result(result, config.out_dir, f"step_{config.device}", config.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
