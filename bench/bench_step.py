"""End-to-end training-step benchmark: what amp_inspect adds to a mixed-precision step of a small GPT.

The model is the ``gpt2-style`` gradient set of bench_tensor_stats.py at context 128: 6 layers, d_model 384,
6 heads, MLP 4x, vocab 8192, tied embeddings (the lm_head reuses wte.weight: 76 parameter tensors, 13.8M
elements). Batch 4 x 128 tokens of fixed random data, AdamW, GradScaler; autocast bf16 on CPU, fp16 on CUDA
(``--amp-dtype`` another; float32: no autocast, for a CPU that emulates bf16 matmuls, where a bf16 step is tens of
times slower and every overhead ratio shrinks with it).
No step overflows, so GradScaler never skips and the activation hooks of ``on_skip`` are never armed.

Configurations, each with its own copy of the model (same initial weights), optimizer and scaler:

- ``bare``: torch.amp.GradScaler, no inspection (the baseline).
- ``check``: ``attach(model, scaler)`` (default activations="on_skip") and ``insp.check()`` every step.
- ``inspecting_scaler``: InspectingGradScaler, attached with ``attach(model, scaler)`` for module names and
  history; no check() (its unscale pass is the inspection).
- ``check_every10``: ``attach(model, scaler, every=10)`` and ``insp.check()`` every step.
- ``inspecting_headroom``: InspectingGradScaler(policy="headroom") + ``attach(model, scaler)``, no check(): timed
  beside ``inspecting_scaler`` (policy="torch"), whose step it is compared with round by round.

With ``--readiness`` the configurations are the cost of format readiness (``readiness_every``) instead: ``bare``,
``check``, ``readiness_step`` (``readiness_every=1``: every step a readiness step, hooks on, X, W, dY and dW of
every Linear measured) and ``readiness_every100`` (its timed steps are the 99 of 100 without hooks, as long as
warmup + rounds x steps stays below 100). One readiness step against a bare step is the paired ratio of
``readiness_step``; the step overhead averaged over a run at ``readiness_every=100`` is made from the two measured
kinds of step, ``(99 * x_between + x_readiness) / 100 - 1`` (against bare, and against check() alone), since a
run's steps are exactly those two kinds.

With ``--update`` they are the cost of measuring what the optimizer did (``optimizer=opt, update_every``) the same
way: ``bare``, ``check``, ``update_step`` (``update_every=1``: every step snapshots the parameters with gradients
before AdamW's step and runs ``update_stats`` after it) and ``update_every100`` (the steps between), and the
averaged overhead ``(99 * x_between + x_update) / 100 - 1``, judged against check() alone (what update_every adds to
an inspected run; check() is judged by its own target) and printed against bare too.

They run interleaved in one process: a few warmup steps each, then rounds in which every configuration takes
a few steps (the order rotating each round), so drift in machine load touches all of them alike. A step is
zero_grad, forward and loss under autocast, scaled backward, check() where configured, scaler.step and
scaler.update, timed from its start to its end (CUDA synchronized at both ends). Overhead against ``bare``
is the median over rounds of (config's median step in the round / bare's median step in the round).
The headroom policy's cost is the median over rounds of (its step / policy="torch"'s step in the same round),
with a ~95% confidence interval of that median: the difference is within the run's spread when it holds 1.
The passes over the gradients alone (tensor_stats, the InspectingGradScaler's unscale_stats_, GradScaler's
check, foreach_norm as the roofline proxy) are timed separately to give the inspection's share of a step.

Run:
    python bench/bench_step.py [--device cpu|cuda] [--quick] [--readiness | --update] [--rounds N]
        [--steps-per-round N] [--out DIR] [--amp-dtype bfloat16|float16|float32]

Prints a table and PASS/MISS lines for the targets and writes bench/results/step_<device>.json
(a --quick run writes nothing unless --out is given, and then to step_<device>_quick.json).
"""

from __future__ import annotations

import argparse
import copy
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

# Run from a checkout without installing: the package one folder up, harness and models beside this file.
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import (  # noqa: E402
    RESULTS_DIR,
    SEED,
    PhaseClock,
    StepMeasurement,
    TargetCheck,
    at_most,
    foreach_norm,
    fused,
    gradscaler_check,
    has_cuda_or_says_why,
    interleave,
    load_average,
    machine_info,
    median_ci,
    paired_ratios,
    print_checks,
    print_table,
    time_calls,
    training_step,
    write_result,
)
from models import ModelSpec, autocast_words, make_gpt, next_token_loss, token_batches  # noqa: E402

import amp_inspect  # noqa: E402
from amp_inspect.core import ops as _ops  # noqa: E402
from amp_inspect.core.format_readiness import format_readiness  # noqa: E402

BARE = "bare"
CHECK = "check"
INSPECTING_SCALER = "inspecting_scaler"
CHECK_EVERY10 = "check_every10"
INSPECTING_HEADROOM = "inspecting_headroom"
READINESS_STEP = "readiness_step"
READINESS_EVERY100 = "readiness_every100"
READINESS_EVERY = 100
UPDATE_STEP = "update_step"
UPDATE_EVERY100 = "update_every100"
UPDATE_EVERY = 100
# Issue 33's CPU target for one readiness step against a bare step (issue 21's was 2x).
READINESS_STEP_TARGET = 1.5

# Targets (the lead's acceptance criteria): step-time overhead of a check() every step, and the
# InspectingGradScaler's step time relative to GradScaler's.
CPU_MAX_CHECK_OVERHEAD_PCT = 3.0
CUDA_MAX_CHECK_OVERHEAD_PCT = 1.0
MAX_SCALER_RATIO = 1.05

LEARNING_RATE = 3e-4
DISTINCT_BATCHES = 8  # step k of every configuration uses batch k % DISTINCT_BATCHES


# ---------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class StepConfig:
    """One way to train: ``scaler`` "torch", "inspecting" or "headroom" (InspectingGradScaler with
    policy="headroom"); ``attach`` with ``every``; ``check`` each step."""

    name: str
    description: str
    scaler: str = "torch"
    attach: bool = False
    check: bool = False
    every: int = 1
    readiness_every: int | None = None
    update_every: int | None = None


CONFIGS: tuple[StepConfig, ...] = (
    StepConfig(BARE, "GradScaler, no inspection"),
    StepConfig(CHECK, "attach(model, scaler) + check() every step", attach=True, check=True),
    StepConfig(INSPECTING_SCALER, "InspectingGradScaler + attach, no check()", scaler="inspecting", attach=True),
    StepConfig(CHECK_EVERY10, "attach(model, scaler, every=10) + check()", attach=True, check=True, every=10),
    StepConfig(INSPECTING_HEADROOM, 'InspectingGradScaler(policy="headroom") + attach', scaler="headroom", attach=True),
)
READINESS_CONFIGS: tuple[StepConfig, ...] = (
    CONFIGS[0],
    CONFIGS[1],
    StepConfig(
        READINESS_STEP, "readiness_every=1 + check(): readiness steps", attach=True, check=True, readiness_every=1
    ),
    StepConfig(
        READINESS_EVERY100,
        f"readiness_every={READINESS_EVERY} + check(): the steps between",
        attach=True,
        check=True,
        readiness_every=READINESS_EVERY,
    ),
)

UPDATE_CONFIGS: tuple[StepConfig, ...] = (
    CONFIGS[0],
    CONFIGS[1],
    StepConfig(
        UPDATE_STEP, "update_every=1 + check(): measured optimizer steps", attach=True, check=True, update_every=1
    ),
    StepConfig(
        UPDATE_EVERY100,
        f"update_every={UPDATE_EVERY} + check(): the steps between",
        attach=True,
        check=True,
        update_every=UPDATE_EVERY,
    ),
)


@dataclass(frozen=True)
class BenchConfig:
    device: str
    quick: bool
    readiness: bool
    update: bool
    out_dir: Path | None
    amp_dtype: str
    warmup_steps: int  # per configuration, untimed
    rounds: int
    steps_per_round: int  # per configuration and round
    kernel_warmup: int
    kernel_repeats: int


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
    policy_cost: dict[str, object] = field(default_factory=dict)  # policy="headroom" against policy="torch"
    readiness_cost: dict[str, object] = field(default_factory=dict)  # --readiness: the two kinds of step
    update_cost: dict[str, object] = field(default_factory=dict)  # --update: the two kinds of step


# ---------------------------------------------------------------------------------------------- timing


StepTimes = tuple[float, float, float, float]  # ms: total, forward + backward, check(), scaler.step + update


class Trainer:
    """One configuration's model, optimizer, scaler and (optional) inspector."""

    def __init__(self, spec: StepConfig, model: nn.Module, device: str, amp_dtype: torch.dtype) -> None:
        self.spec = spec
        self.device = device
        self.amp_dtype = amp_dtype
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
        if spec.scaler == "torch":
            self.scaler: torch.amp.GradScaler = torch.amp.GradScaler(device)
        else:
            policy = "headroom" if spec.scaler == "headroom" else "torch"
            self.scaler = amp_inspect.InspectingGradScaler(device, policy=policy)
        self.inspector = (
            amp_inspect.attach(
                model,
                self.scaler,
                every=spec.every,
                readiness_every=spec.readiness_every,
                optimizer=self.opt if spec.update_every else None,
                update_every=spec.update_every,
            )
            if spec.attach
            else None
        )
        self.init_scale = self.scaler.get_scale()
        self.steps = 0
        self.times: list[list[StepTimes]] = []  # one list per timed round

    def step(self, batches: Sequence[torch.Tensor]) -> StepTimes:
        """One training step: (total, forward + backward, check, scaler.step + update) in ms."""
        idx = batches[self.steps % len(batches)]
        self.steps += 1
        cuda = self.device == "cuda"
        clock = PhaseClock(self.device)
        if cuda:
            torch.cuda.synchronize()
        inspect_step = self.inspector.check if self.spec.check and self.inspector is not None else None
        assert inspect_step is not None or not self.spec.check
        loss = functools.partial(next_token_loss, self.model, idx, self.device, self.amp_dtype)
        start = time.perf_counter()
        training_step(self.opt, self.scaler, loss, inspect_step, clock.mark)
        if cuda:
            torch.cuda.synchronize()
        total = (time.perf_counter() - start) * 1e3
        fwd_bwd, check, opt = clock.intervals_ms()
        return total, fwd_bwd, check, opt


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


def readiness_operands(model: nn.Module, batch: torch.Tensor, device: str, amp_dtype: torch.dtype) -> list[list]:
    """The tensors one readiness step measures, grouped as the readiness hooks call format_readiness: (X, W) per
    Linear call, dY per call, dW per Linear. Taken from one step of ``model`` with hooks of this function's own."""
    calls: list[list[torch.Tensor]] = []
    handles = []
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]

    def pre(module: nn.Module, args: tuple) -> None:
        calls.append([args[0].detach().clone(), module.weight.detach()])

    def post(module: nn.Module, args: tuple, out: torch.Tensor) -> None:
        out.register_hook(lambda g: calls.append([g.detach().clone()]))

    for m in linears:
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    model.zero_grad(set_to_none=True)
    next_token_loss(model, batch, device, amp_dtype).backward()
    for h in handles:
        h.remove()
    calls += [[m.weight.grad.detach()] for m in linears if m.weight.grad is not None]
    return calls


def readiness_passes(
    trainer: Trainer, config: BenchConfig, batch: torch.Tensor, bare_step_ms: float
) -> list[PassTiming]:
    """--readiness: one readiness step's format_readiness calls alone (every recipe), and tensor_stats on the same
    tensors, timed like the passes over the gradients (their share of bare's median step)."""
    calls = readiness_operands(trainer.model, batch, config.device, trainer.amp_dtype)
    elements = sum(t.numel() for call in calls for t in call)
    work = {
        "format_readiness (a readiness step)": lambda: [format_readiness(call) for call in calls],
        "tensor_stats, same tensors": lambda: [amp_inspect.tensor_stats(call) for call in calls],
    }
    rows = []
    for name, fn in work.items():
        times = time_calls(fn, config.device, 1, max(3, config.kernel_repeats // 10))
        median = statistics.median(times)
        what = f"{len(calls)} calls, {elements / 1e6:.1f}M elements: X, W, dY, dW of every Linear"
        rows.append(PassTiming(name, what, median, min(times), median / bare_step_ms))
    return rows


def readiness_cpu_seconds(trainer: Trainer, config: BenchConfig, batch: torch.Tensor, repeats: int = 5) -> dict:
    """--readiness on the CPU: process CPU time (both torch threads) of a bare step and of one readiness step's
    measurement work, ``repeats`` of each alternating. CPU time counts only while this process runs, so on a machine
    shared with other jobs it moves far less than wall time does (cache sharing still moves it)."""
    calls = readiness_operands(trainer.model, batch, config.device, trainer.amp_dtype)
    bare, work = [], []
    for _ in range(repeats):
        start = time.process_time()
        trainer.step([batch])
        bare.append(time.process_time() - start)
        start = time.process_time()
        for call in calls:
            format_readiness(call)
        work.append(time.process_time() - start)
    ratio = statistics.median(work) / statistics.median(bare)
    return {
        "bare_step_cpu_s": bare,
        "readiness_work_cpu_s": work,
        "work_over_bare_step": ratio,
        "readiness_step_x_bare": 1 + ratio,
        f"averaged_overhead_every{READINESS_EVERY}": ratio / READINESS_EVERY,
    }


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
    only shown), and the inspecting ones must not have armed activation hooks. The headroom policy starts at
    scale 1 and moves the scale every step, so its scale says nothing about skips (its history does)."""
    checks = []
    bare = trainers[0]
    for trainer in trainers:
        scale = trainer.scaler.get_scale()
        # GradScaler's rule: a skip halves the scale; growth needs 2000 clean steps.
        skipped = trainer.spec.scaler != "headroom" and scale < trainer.init_scale
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
    m = by_name[CHECK]
    assert m.overhead_pct is not None and m.x_bare_paired_min is not None and m.x_bare_paired_max is not None
    detail = (
        f"rounds {(m.x_bare_paired_min - 1) * 100:+.1f}% to {(m.x_bare_paired_max - 1) * 100:+.1f}%; "
        f"medians {m.median_ms:.1f} vs {bare.median_ms:.1f} ms; check() itself {m.check_median_ms:.2f} ms = "
        f"{m.check_median_ms / bare.median_ms * 100:.2f}% of a bare step, tensor_stats alone "
        f"{share['tensor_stats'] * 100:.2f}%"
    )
    checks = [at_most("check() every step: step overhead", m.overhead_pct, max_pct, detail, unit="%")]
    m = by_name[INSPECTING_SCALER]
    assert m.x_bare_paired is not None and m.x_bare_paired_min is not None and m.x_bare_paired_max is not None
    detail = (
        f"rounds {m.x_bare_paired_min:.3f}x to {m.x_bare_paired_max:.3f}x; "
        f"scaler.step + update {m.opt_median_ms:.2f} ms vs {bare.opt_median_ms:.2f} ms"
    )
    checks.append(at_most("InspectingGradScaler step vs GradScaler's", m.x_bare_paired, MAX_SCALER_RATIO, detail))
    return checks


def policy_cost(rows: list[StepMeasurement]) -> tuple[dict[str, object], TargetCheck]:
    """policy="headroom" against policy="torch" (both InspectingGradScaler + attach, run interleaved): the
    median over rounds of the per-round step ratio, its ~95% confidence interval (the run's own spread) and
    the rounds' quartiles. The cost is unmeasurable when the interval holds 1."""
    by_name = {m.config: m for m in rows}
    headroom, torch_policy = by_name[INSPECTING_HEADROOM], by_name[INSPECTING_SCALER]
    ratios = paired_ratios(headroom.round_medians_ms, torch_policy.round_medians_ms)
    ratio = statistics.median(ratios)
    low, high = median_ci(ratios)
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) >= 2 else (ratio, ratio, ratio)
    opt_ms = headroom.opt_median_ms - torch_policy.opt_median_ms
    cost = {
        "ratio": ratio,
        "ci95": [low, high],
        "round_ratio_quartiles": [q1, q3],
        "rounds": len(ratios),
        "scaler_step_update_ms": [headroom.opt_median_ms, torch_policy.opt_median_ms],
        "scaler_step_update_extra_ms": opt_ms,
        "within_spread": low <= 1.0 <= high,
    }
    detail = (
        f"step {ratio:.3f}x policy='torch' (95% CI {low:.3f}-{high:.3f}, rounds' quartiles {q1:.3f}-{q3:.3f}); "
        f"scaler.step + update {headroom.opt_median_ms:.2f} vs {torch_policy.opt_median_ms:.2f} ms ({opt_ms:+.2f})"
    )
    check = TargetCheck(
        "policy='headroom' per-step cost within the run's spread (CI holds 1)", low <= 1.0 <= high, detail
    )
    return cost, check


def readiness_cost(
    rows: list[StepMeasurement], passes: list[PassTiming]
) -> tuple[dict[str, object], list[TargetCheck]]:
    """--readiness: one readiness step against a bare step (paired, with the rounds' range), the steps between
    readiness steps against check() alone, and the overhead averaged over a run at readiness_every=100 made from
    them (module docstring), against bare and against check()."""
    by_name = {m.config: m for m in rows}
    step, between, check = by_name[READINESS_STEP], by_name[READINESS_EVERY100], by_name[CHECK]
    assert step.x_bare_paired is not None and between.x_bare_paired is not None
    n = READINESS_EVERY
    between_vs_check = paired_ratios(between.round_medians_ms, check.round_medians_ms)
    step_vs_check = paired_ratios(step.round_medians_ms, check.round_medians_ms)
    averaged_vs_bare = ((n - 1) * between.x_bare_paired + step.x_bare_paired) / n - 1
    averaged_vs_check = ((n - 1) * statistics.median(between_vs_check) + statistics.median(step_vs_check)) / n - 1
    cost = {
        "readiness_step_x_bare": step.x_bare_paired,
        "readiness_step_x_bare_range": [step.x_bare_paired_min, step.x_bare_paired_max],
        "readiness_step_x_check": statistics.median(step_vs_check),
        "between_steps_x_check": statistics.median(between_vs_check),
        "between_steps_x_check_range": [min(between_vs_check), max(between_vs_check)],
        f"averaged_overhead_every{n}_vs_bare": averaged_vs_bare,
        f"averaged_overhead_every{n}_vs_check": averaged_vs_check,
    }
    bare_fwd_bwd = statistics.median(by_name[BARE].fwd_bwd_ms)
    # The same two figures from the measurement work alone (its calls timed apart, less exposed to the machine's
    # load than whole steps): a readiness step is a bare step plus that work.
    work = next(p for p in passes if p.method.startswith("format_readiness"))
    cost["work_share_of_bare_step"] = work.share_of_step
    cost[f"work_averaged_every{n}"] = work.share_of_step / n
    checks = [
        at_most(
            f"one readiness step vs a bare step (CPU target {READINESS_STEP_TARGET:g}x)",
            step.x_bare_paired,
            READINESS_STEP_TARGET,
            f"rounds {step.x_bare_paired_min:.2f}x to {step.x_bare_paired_max:.2f}x; check() (dW) "
            f"{step.check_median_ms:.0f} ms, forward + backward (X, W, dY) {statistics.median(step.fwd_bwd_ms):.0f} "
            f"ms vs bare's {bare_fwd_bwd:.0f} ms",
        ),
        at_most(
            f"readiness_every={n}: step overhead averaged over a run, vs check() alone (target 1%)",
            averaged_vs_check * 100,
            1.0,
            f"steps between readiness steps {statistics.median(between_vs_check):.3f}x check()'s (rounds "
            f"{min(between_vs_check):.3f}-{max(between_vs_check):.3f}), a readiness step "
            f"{statistics.median(step_vs_check):.2f}x; vs bare {averaged_vs_bare * 100:+.2f}%",
            unit="%",
        ),
        at_most(
            f"from the measurement work alone: a readiness step vs a bare step (CPU target {READINESS_STEP_TARGET:g}x)",
            1 + work.share_of_step,
            READINESS_STEP_TARGET,
            f"format_readiness over one readiness step's tensors {work.median_ms:.0f} ms (min {work.min_ms:.0f}) on a "
            f"bare step of {by_name[BARE].median_ms:.0f} ms",
        ),
        at_most(
            f"from the measurement work alone: readiness_every={n} averaged over a run (target 1%)",
            work.share_of_step / n * 100,
            1.0,
            f"{work.share_of_step * 100:.0f}% of a bare step, once every {n} steps",
            unit="%",
        ),
    ]
    return cost, checks


def update_cost(rows: list[StepMeasurement]) -> tuple[dict[str, object], list[TargetCheck]]:
    """--update: one measured optimizer step against a bare step (paired, with the rounds' range) and the overhead
    averaged over a run at update_every=100, made from the two kinds of step (module docstring)."""
    by_name = {m.config: m for m in rows}
    step, between, check = by_name[UPDATE_STEP], by_name[UPDATE_EVERY100], by_name[CHECK]
    assert step.x_bare_paired is not None and between.x_bare_paired is not None
    n = UPDATE_EVERY
    averaged_vs_bare = ((n - 1) * between.x_bare_paired + step.x_bare_paired) / n - 1
    between_vs_check = paired_ratios(between.round_medians_ms, check.round_medians_ms)
    step_vs_check = paired_ratios(step.round_medians_ms, check.round_medians_ms)
    averaged_vs_check = ((n - 1) * statistics.median(between_vs_check) + statistics.median(step_vs_check)) / n - 1
    cost = {
        "update_step_x_bare": step.x_bare_paired,
        "update_step_x_bare_range": [step.x_bare_paired_min, step.x_bare_paired_max],
        "update_step_x_check": statistics.median(step_vs_check),
        "between_steps_x_check": statistics.median(between_vs_check),
        f"averaged_overhead_every{n}_vs_bare": averaged_vs_bare,
        f"averaged_overhead_every{n}_vs_check": averaged_vs_check,
        "update_step_opt_ms": step.opt_median_ms,
        "bare_opt_ms": by_name[BARE].opt_median_ms,
    }
    checks = [
        at_most(
            "one measured optimizer step vs a bare step (CPU target 1.3x, issue 33)",
            step.x_bare_paired,
            1.3,
            f"rounds {step.x_bare_paired_min:.3f}x to {step.x_bare_paired_max:.3f}x; scaler.step + update "
            f"{step.opt_median_ms:.1f} ms vs bare's {by_name[BARE].opt_median_ms:.1f} ms",
        ),
        # What update_every adds to an inspected run: check() runs on every step either way, and its own cost is
        # judged by its own target (the default run), as readiness_every's is.
        at_most(
            f"update_every={n}: step overhead averaged over a run, vs check() alone (target 1%)",
            averaged_vs_check * 100,
            1.0,
            f"steps between {statistics.median(between_vs_check):.3f}x check()'s, a measured step "
            f"{statistics.median(step_vs_check):.3f}x; vs bare {averaged_vs_bare * 100:+.2f}% (check() itself "
            f"{(check.x_bare_paired or 1.0) - 1:+.2%})",
            unit="%",
        ),
    ]
    return cost, checks


# ----------------------------------------------------------------------------------------------- output


def print_results(result: BenchResult) -> None:
    """Step times in ms. ``overhead`` and ``x bare, paired``: median over rounds of the per-round ratio to bare
    (range: the rounds' extremes); ``x medians``: ratio of the overall medians; ``direct``: the inspection's own
    time (check() + scaler.step/update beyond bare's), also as % of bare's median step."""
    bare_ms = result.measurements[0].median_ms
    headers = ["config", "steps", "median", "min", "max", "IQR", "fwd+bwd", "check()", "opt.step", "overhead"]
    headers += ["x bare, paired [range]", "x medians", "direct"]
    rows = []
    for m in result.measurements:
        assert m.direct_ms is not None and m.overhead_pct is not None and m.x_bare is not None
        rows.append(
            [m.config, len(m.step_ms), f"{m.median_ms:.1f}", f"{m.min_ms:.1f}", f"{m.max_ms:.1f}"]
            + [f"{m.q1_ms:.1f}-{m.q3_ms:.1f}", f"{statistics.median(m.fwd_bwd_ms):.2f}", f"{m.check_median_ms:.2f}"]
            + [f"{m.opt_median_ms:.2f}", f"{m.overhead_pct:+.2f}%"]
            + [f"{m.x_bare_paired:.3f} [{m.x_bare_paired_min:.3f}, {m.x_bare_paired_max:.3f}]", f"{m.x_bare:.3f}"]
            + [f"{m.direct_ms:.2f} ({m.direct_ms / bare_ms * 100:+.1f}%)"]
        )
    print_table(headers, rows)
    print()
    rows = [[p.method, f"{p.median_ms:.3f}", f"{p.min_ms:.3f}", f"{p.share_of_step * 100:.2f}"] for p in result.passes]
    print_table(["pass over the gradients", "ms (median)", "ms (min)", "% of bare step"], rows)


def default_amp_dtype(device: str) -> str:
    """The autocast dtype a run takes without --amp-dtype (its results keep the file name without a suffix)."""
    return "float16" if device == "cuda" else "bfloat16"


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke test: few rounds and steps, no JSON")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 20; quick: 2)")
    parser.add_argument("--steps-per-round", type=int, default=None, help="steps per config and round (default 2)")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON folder (default {RESULTS_DIR}; quick: none)")
    parser.add_argument("--readiness", action="store_true", help="the cost of readiness_every instead (docstring)")
    parser.add_argument("--update", action="store_true", help="the cost of update_every instead (docstring)")
    parser.add_argument(
        "--amp-dtype",
        choices=("bfloat16", "float16", "float32"),
        default=None,
        help="the forward's autocast dtype (default bfloat16 on cpu, float16 on cuda; float32: no autocast)",
    )
    args = parser.parse_args(argv)
    out_dir = args.out if args.out is not None or args.quick else RESULTS_DIR
    amp_dtype = args.amp_dtype or default_amp_dtype(args.device)
    if args.quick:
        rounds, steps, warmup, kernel_warmup, kernel_repeats = 2, 2, 1, 1, 5
    else:
        rounds, steps, warmup, kernel_warmup, kernel_repeats = 20, 2, 3, 3, 30
    return BenchConfig(
        args.device,
        args.quick,
        args.readiness,
        args.update,
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
    if not has_cuda_or_says_why(config.device):
        return 2

    spec = ModelSpec()
    base = make_gpt(spec, config.device, SEED)
    batches = token_batches(spec, DISTINCT_BATCHES, SEED + 1, config.device)
    amp_dtype = getattr(torch, config.amp_dtype)
    configs = READINESS_CONFIGS if config.readiness else UPDATE_CONFIGS if config.update else CONFIGS
    trainers = [Trainer(c, copy.deepcopy(base), config.device, amp_dtype) for c in configs]
    numel = sum(p.numel() for p in base.parameters())
    tensors = len(list(base.parameters()))
    model_info = {**asdict(spec), "parameters": numel, "parameter_tensors": tensors}
    result = BenchResult(machine_info(config.device), {k: str(v) for k, v in asdict(config).items()}, model_info)
    print(
        f"# GPT {spec.layers}x{spec.d_model}, {spec.heads} heads, vocab {spec.vocab}, context {spec.context}, "
        f"tied embeddings: {numel:,} parameters in {tensors} tensors; batch {spec.batch}x{spec.context}; "
        f"{config.device}, {autocast_words(config.amp_dtype)}, AdamW",
        flush=True,
    )
    print(
        f"# {len(configs)} configs interleaved: {config.warmup_steps} warmup steps each, then {config.rounds} rounds "
        f"x {config.steps_per_round} steps each",
        flush=True,
    )

    _, timed = interleave(
        trainers, lambda t: t.step(batches), config.warmup_steps, config.rounds, config.steps_per_round
    )
    for trainer, rounds in zip(trainers, timed, strict=True):
        trainer.times = rounds
    result.measurements = measurements_of(trainers)
    bare_ms = result.measurements[0].median_ms
    result.passes = time_passes(trainers[0], config, bare_ms)
    if config.readiness:
        result.passes += readiness_passes(trainers[0], config, batches[0], bare_ms)
    result.agreement = check_agreement(trainers, config.device)
    if config.readiness:
        result.readiness_cost, result.targets = readiness_cost(result.measurements, result.passes)
        if config.device == "cpu":
            cpu = readiness_cpu_seconds(trainers[0], config, batches[0])
            result.readiness_cost["cpu_time"] = cpu
            bare_s, work_s = statistics.median(cpu["bare_step_cpu_s"]), statistics.median(cpu["readiness_work_cpu_s"])
            spread = f"bare {min(cpu['bare_step_cpu_s']):.2f}-{max(cpu['bare_step_cpu_s']):.2f} s, work "
            spread += f"{min(cpu['readiness_work_cpu_s']):.2f}-{max(cpu['readiness_work_cpu_s']):.2f} s"
            result.targets += [
                at_most(
                    f"CPU time: a readiness step vs a bare step (target {READINESS_STEP_TARGET:g}x)",
                    cpu["readiness_step_x_bare"],
                    READINESS_STEP_TARGET,
                    f"work {work_s:.2f} s on a bare step of {bare_s:.2f} s (medians of 5; {spread})",
                ),
                at_most(
                    f"CPU time: readiness_every={READINESS_EVERY} averaged over a run (target 1%)",
                    cpu[f"averaged_overhead_every{READINESS_EVERY}"] * 100,
                    1.0,
                    f"the work is {cpu['work_over_bare_step']:.2f} bare steps, once every {READINESS_EVERY} steps",
                    unit="%",
                ),
            ]
    elif config.update:
        result.update_cost, result.targets = update_cost(result.measurements)
    else:
        result.targets = check_targets(config.device, result.measurements, result.passes)
        result.policy_cost, cost_check = policy_cost(result.measurements)
        result.targets.append(cost_check)
    # Load during the run, beside the load before it: high values mean the timings shared the CPUs.
    result.machine["load_average_after"] = load_average()

    print()
    print_results(result)
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
        name = f"step_{config.device}" + ("_readiness" if config.readiness else "_update" if config.update else "")
        if config.amp_dtype != default_amp_dtype(config.device):
            name += f"_{config.amp_dtype}"  # beside the default dtype's results, not over them
        write_result(result, config.out_dir, name, config.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
