"""Distributed benchmark: what amp_inspect all-reduces and what it adds to a training step, DDP and FSDP2.

Two processes (torch.multiprocessing, spawn) on gloo over 127.0.0.1, one torch thread each, train a small
GPT (models.make_gpt, bench_step.py's model, amp_inspect.cli.tiny_gpt.TinyGPT: pre-LN blocks, tied embeddings, GPT-2
initialisation) with bf16 autocast on CPU (--amp-dtype float32: none), GradScaler("cpu") (init scale 2**10) and AdamW;
each rank trains on its own fixed random batches.

Configurations, each with its own copy of the model (same initial weights), optimizer and scaler:

- ``ddp_bare``: DistributedDataParallel + torch.amp.GradScaler, no amp_inspect (the DDP baseline).
- ``ddp_check``: ``attach(ddp, scaler)``, which registers ``amp_inspect.ddp_comm_hook``, and ``check()``
  every step.
- ``ddp_check_nohook``: ``attach(ddp, scaler, ddp_hook=False)`` and ``check()`` every step.
- ``ddp_inspecting_scaler``: InspectingGradScaler + ``attach(ddp, scaler)`` (hook registered), no check().
- ``fsdp_bare``: FSDP2 (``fully_shard`` per block, then the root) + torch.amp.GradScaler (the FSDP2 baseline).
- ``fsdp_check``: ``attach(model, scaler)`` and ``check()`` every step (combines the shards' statistics).
- ``fsdp_inspecting_scaler``: InspectingGradScaler + ``attach(model, scaler)``, no check().

Time: all seven run interleaved in each process: 3 warmup steps each, then 60 rounds in which every
configuration takes one step (--steps-per-round), the order rotating each round, so that changes in machine
load touch all alike (short rounds: on 2 shared cores the load changes within seconds). Before each step the
ranks meet at a barrier (untimed); a step is zero_grad, forward and loss under autocast, scaled backward,
check() where configured, scaler.step and scaler.update, timed from its start to its end on both ranks. The
table shows rank 0's times. Overhead against the family's bare configuration is the median over rounds of
(config's median step in the round / bare's median step in the round), as in bench_step.py, with a
distribution-free ~95% confidence interval of that median. The time spent in the comm hook's inspection
(inside backward) and in reduce_stats (inside check() or scaler.step) is timed by wrapping those functions.

Bytes: ``torch.distributed.all_reduce`` (and the functional ``all_reduce`` that DTensor uses) are wrapped
in each process by a counter of numel * element_size per call, classified by the calling function:
``amp_inspect.distributed.ddp`` averaging the bucket (``HookState.average``) is DDP's own gradient averaging (a comm
hook must do it), the one-time
``amp_inspect.distributed.combine.check_same_layout`` is reported apart, any other amp_inspect caller is the
inspection's traffic, and callers in torch are torch's own (GradScaler's found_inf on DTensor gradients).
DDP's reducer without a hook and FSDP2's reduce-scatter / all-gather do not go through these functions and
are not counted; the gradient bytes (parameters * 4) are shown for scale. The measured inspection bytes are
printed beside the sizes from the docstrings of amp_inspect/distributed/ddp.py and amp_inspect/distributed/combine.py.

Why this file is ~800 lines: besides the timing (harness.py) it holds its own instruments, which belong to no
other benchmark: the all-reduce byte counter classified by caller, the timer wrapped around the comm hook and
reduce_stats, the two spawned ranks and their hand-back of records, and the byte formulas it checks.

Run:
    python bench/bench_distributed.py [--quick] [--rounds N] [--steps-per-round N] [--out DIR]
        [--amp-dtype float32]   # no autocast: on a CPU that emulates bf16 matmuls (AVX2 without AVX512-BF16)
    python bench/bench_distributed.py --traffic   # bytes per step only: DDP, FSDP2, tensor parallel at 2-8 ranks

Prints a table and writes bench/results/distributed_cpu.json (``--amp-dtype float32``: distributed_cpu_float32.json;
a --quick run writes nothing unless --out is given, and then to the name with _quick).
"""

from __future__ import annotations

import argparse
import copy
import functools
import queue
import socket
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp
from torch import nn

# Run from a checkout without installing: the package one folder up, harness and models beside this file
# (spawned processes inherit sys.path).
sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

from harness import (  # noqa: E402
    RESULTS_DIR,
    SEED,
    StepMeasurement,
    TargetCheck,
    interleave,
    load_average,
    machine_info,
    median_ci,
    paired_ratios,
    print_checks,
    print_table,
    training_step,
    write_result,
)
from models import ModelSpec, autocast_words, make_gpt, next_token_loss, token_batches  # noqa: E402

import amp_inspect  # noqa: E402
from amp_inspect.cli.tiny_gpt import TinyGPT  # noqa: E402
from amp_inspect.core import ops as _ops  # noqa: E402
from amp_inspect.distributed import combine as amp_distributed  # noqa: E402
from amp_inspect.distributed.combine import to_local  # noqa: E402
from amp_inspect.distributed.ddp import NonfiniteByRank  # noqa: E402

WORLD = 2
BACKEND = "gloo"
# --amp-dtype: the forward's autocast dtype; float32 turns autocast off (models.next_token_loss).
AMP_DTYPES = ("bfloat16", "float32")
THREADS_PER_RANK = 1  # 2 cores, 2 ranks
STEM = "distributed_cpu"
PG_TIMEOUT_S = 120.0
RESULT_TIMEOUT_S = 900.0  # the parent's wait for the ranks' results
NOISY_CI_HALF_WIDTH_PCT = 3.0  # a wider interval on any overhead: the run is called noisy

# Model: bench_step.py's GPT (models.make_gpt), smaller, so that a DDP step on one thread per rank takes ~50-300 ms.
MODEL = ModelSpec(layers=4, d_model=256, heads=4, vocab=8192, context=128, batch=4)
INIT_SCALE = 2.0**10
LEARNING_RATE = 3e-4
DISTINCT_BATCHES = 4  # per rank; step k of every configuration uses batch k % DISTINCT_BATCHES
FORMATS = ("fp16",)  # attach()'s default: F = 1 in the size formulas

DDP = "ddp"
FSDP = "fsdp"
DDP_BARE = "ddp_bare"
FSDP_BARE = "fsdp_bare"

# Traffic categories, by the function that called the all-reduce.
DDP_GRADIENTS = "ddp_gradients"  # the hook's dist.all_reduce(bucket) (HookState.average): DDP's averaging
INSPECTION = "inspection"  # every other all-reduce made from amp_inspect, per step
LAYOUT_CHECK = "layout_check"  # check_same_layout: once per inspector / scaler, before the first combine
TORCH_OWN = "torch"  # called from torch itself (DTensor's found_inf reduction in GradScaler's unscale)
OTHER = "other"
CATEGORIES = (DDP_GRADIENTS, INSPECTION, LAYOUT_CHECK, TORCH_OWN, OTHER)
HOOK_FUNCTIONS = ("ddp_comm_hook", "average")  # where amp_inspect/distributed/ddp.py all-reduces the gradient bucket
LAYOUT_FUNCTION = "check_same_layout"


# ---------------------------------------------------------------------------------------------- configs


@dataclass(frozen=True)
class DistConfig:
    """One way to train: ``family`` ddp or fsdp; ``scaler`` "torch" or "inspecting"; ``attach`` (with or
    without the DDP comm hook); ``check`` every step."""

    name: str
    family: str
    description: str
    scaler: str = "torch"
    attach: bool = False
    ddp_hook: bool = True
    check: bool = False


CONFIGS: tuple[DistConfig, ...] = (
    DistConfig(DDP_BARE, DDP, "DDP + GradScaler, no amp_inspect"),
    DistConfig("ddp_check", DDP, "attach(ddp, scaler) (comm hook) + check()", attach=True, check=True),
    DistConfig(
        "ddp_check_nohook",
        DDP,
        "attach(ddp, scaler, ddp_hook=False) + check()",
        attach=True,
        ddp_hook=False,
        check=True,
    ),
    DistConfig(
        "ddp_inspecting_scaler", DDP, "InspectingGradScaler + attach (comm hook)", scaler="inspecting", attach=True
    ),
    DistConfig(FSDP_BARE, FSDP, "FSDP2 + GradScaler, no amp_inspect"),
    DistConfig("fsdp_check", FSDP, "attach(model, scaler) + check()", attach=True, check=True),
    DistConfig("fsdp_inspecting_scaler", FSDP, "InspectingGradScaler + attach", scaler="inspecting", attach=True),
)
BARE_OF = {DDP: DDP_BARE, FSDP: FSDP_BARE}


@dataclass(frozen=True)
class BenchConfig:
    quick: bool
    out_dir: Path | None
    world: int
    threads_per_rank: int
    warmup_steps: int  # per configuration, untimed
    rounds: int
    steps_per_round: int  # per configuration and round
    init_scale: float
    amp_dtype: str = "bfloat16"  # --amp-dtype: one of AMP_DTYPES
    configs: tuple[str, ...] = ()  # --configs: those run (with their families' bare ones); empty: all

    def chosen(self) -> tuple[DistConfig, ...]:
        """The configurations this run times: ``configs`` and their families' bare baselines, in CONFIGS' order."""
        if not self.configs:
            return CONFIGS
        names = set(self.configs) | {BARE_OF[c.family] for c in CONFIGS if c.name in self.configs}
        return tuple(c for c in CONFIGS if c.name in names)


# ------------------------------------------------------------------------------------------ the counter


Traffic = dict[str, list[int]]  # key -> [calls, bytes]


class CollectiveCounter:
    """Wraps torch.distributed.all_reduce and the functional all_reduce: every call adds its tensor's bytes
    to the current step's record, under its category and under the calling function's qualified name."""

    def __init__(self) -> None:
        self.by_category: Traffic = {}
        self.by_caller: Traffic = {}
        self._originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def install(self) -> None:
        for module in (dist, funcol):
            original = module.all_reduce
            self._originals.append((module, "all_reduce", original))
            module.all_reduce = self._wrap(original)

    def uninstall(self) -> None:
        for module, name, original in reversed(self._originals):
            setattr(module, name, original)
        self._originals.clear()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1)
            self.add(caller.f_globals.get("__name__", "?"), caller.f_code.co_name, tensor)
            return original(tensor, *args, **kwargs)

        return all_reduce

    def add(self, module: str, function: str, tensor: torch.Tensor) -> None:
        if module.startswith("amp_inspect"):
            if function in HOOK_FUNCTIONS:
                category = DDP_GRADIENTS
            elif function == LAYOUT_FUNCTION:
                category = LAYOUT_CHECK
            else:
                category = INSPECTION
        elif module.startswith("torch"):
            category = TORCH_OWN
        else:
            category = OTHER
        size = tensor.numel() * tensor.element_size()
        for table, key in ((self.by_category, category), (self.by_caller, f"{module}.{function}")):
            entry = table.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += size

    @contextmanager
    def recording(self) -> Iterator[tuple[Traffic, Traffic]]:
        """Records the collectives made inside the block into fresh tables (yielded)."""
        self.by_category, self.by_caller = {}, {}
        yield self.by_category, self.by_caller


class CallTimer:
    """Adds up the time spent in a few amp_inspect functions during a step (host clock, ms): the comm hook's
    work per bucket (``NonfiniteByRank.bucket_ready``: the fused NaN/Inf count and, after the last bucket,
    issuing the table's all-reduce) and ``reduce_stats`` (the FSDP2 combine, including the wait for the other
    rank). Their time inside backward or scaler.step is otherwise not separable from the step's."""

    TARGETS: tuple[tuple[Any, str, str], ...] = (
        (NonfiniteByRank, "bucket_ready", "hook_ms"),
        (amp_distributed, "reduce_stats", "combine_ms"),
    )

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._originals: list[tuple[Any, str, Callable[..., Any]]] = []

    def install(self) -> None:
        for owner, name, key in self.TARGETS:
            original = getattr(owner, name)
            self._originals.append((owner, name, original))
            setattr(owner, name, self._wrap(original, key))

    def uninstall(self) -> None:
        for owner, name, original in reversed(self._originals):
            setattr(owner, name, original)
        self._originals.clear()

    def _wrap(self, original: Callable[..., Any], key: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.ms[key] = self.ms.get(key, 0.0) + (time.perf_counter() - start) * 1e3

        return timed

    @contextmanager
    def recording(self) -> Iterator[dict[str, float]]:
        """Adds the time spent inside the block into a fresh table (yielded)."""
        self.ms = {}
        yield self.ms


# ------------------------------------------------------------------------------------------ one process


@dataclass
class StepRecord:
    total_ms: float
    fwd_bwd_ms: float
    check_ms: float
    opt_ms: float
    hook_ms: float  # inside backward: the comm hook's inspection work
    combine_ms: float  # inside check() or scaler.step: reduce_stats
    by_category: Traffic
    by_caller: Traffic


def wrap(config: DistConfig, base: TinyGPT, world: int) -> tuple[nn.Module, nn.Module]:
    """(the model to call, the module that holds the parameters): DDP around a copy, or a copy sharded with
    fully_shard per block and then at the root."""
    model = copy.deepcopy(base)
    if config.family == DDP:
        return nn.parallel.DistributedDataParallel(model), model
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, model


class Trainer:
    """One configuration's model, optimizer, scaler and (optional) inspector, in one rank."""

    def __init__(self, config: DistConfig, base: TinyGPT, world: int, init_scale: float, amp_dtype: str) -> None:
        self.config = config
        self.amp_dtype = getattr(torch, amp_dtype)
        self.model, self.params_module = wrap(config, base, world)
        self.opt = torch.optim.AdamW(self.params_module.parameters(), lr=LEARNING_RATE)
        scaler_cls = amp_inspect.InspectingGradScaler if config.scaler == "inspecting" else torch.amp.GradScaler
        self.scaler = scaler_cls("cpu", init_scale=init_scale)
        self.inspector = (
            amp_inspect.attach(self.model, self.scaler, formats=FORMATS, ddp_hook=config.ddp_hook)
            if config.attach
            else None
        )
        ddp = self.model if isinstance(self.model, nn.parallel.DistributedDataParallel) else None
        self.hook_registered = bool(ddp is not None and getattr(ddp, "_comm_hooks", None))
        self.steps = 0
        self.warmup: list[StepRecord] = []
        self.rounds: list[list[StepRecord]] = []

    def step(self, batches: Sequence[torch.Tensor], counter: CollectiveCounter, timer: CallTimer) -> StepRecord:
        idx = batches[self.steps % len(batches)]
        self.steps += 1
        dist.barrier()  # the ranks start together: no rank's time includes waiting for the other's last step
        inspect_step = self.inspector.check if self.config.check and self.inspector is not None else None
        assert inspect_step is not None or not self.config.check
        marks: list[float] = []
        with counter.recording() as (by_category, by_caller), timer.recording() as spent:
            loss = functools.partial(next_token_loss, self.model, idx, "cpu", self.amp_dtype)
            training_step(self.opt, self.scaler, loss, inspect_step, lambda: marks.append(time.perf_counter()))
        start, after_backward, after_check, end = marks
        return StepRecord(
            (end - start) * 1e3,
            (after_backward - start) * 1e3,
            (after_check - after_backward) * 1e3,
            (end - after_check) * 1e3,
            spent.get("hook_ms", 0.0),
            spent.get("combine_ms", 0.0),
            by_category,
            by_caller,
        )

    def local_parameters(self) -> list[torch.Tensor]:
        """This rank's parameters (FSDP2: its shards)."""
        return [to_local(p.detach()) for p in self.params_module.parameters()]


def final_checks(trainers: list[Trainer], init_scale: float) -> list[dict[str, object]]:
    """No step skipped (the scale never backed off, no report found NaN/Inf); every inspected configuration
    ends with its family's bare weights bit for bit (same data, same initial weights, same steps)."""
    bare = {t.config.name: t for t in trainers if t.config.name in BARE_OF.values()}
    checks: list[dict[str, object]] = []
    for t in trainers:
        scale = t.scaler.get_scale()
        skipped = scale < init_scale  # a skip halves the scale; growth needs 2000 clean steps
        detail = f"{t.steps} steps, final loss scale {scale:g}"
        if t.inspector is not None:
            history = t.inspector.history
            found = sum(r.skipped for r in history)
            skipped = skipped or found > 0
            detail += f", {len(history)} inspected, {found} skipped"
        if t.config.family == DDP:
            detail += f", comm hook registered: {t.hook_registered}"
        checks.append({"name": f"{t.config.name}: no skipped step", "passed": not skipped, "detail": detail})
        reference = bare[BARE_OF[t.config.family]]
        if reference is t:
            continue
        diff = max(
            (a - b).abs().max().item()
            for a, b in zip(t.local_parameters(), reference.local_parameters(), strict=True)
            if a.numel()
        )
        name = f"{t.config.name}: final weights equal {reference.config.name}'s"
        checks.append({"name": name, "passed": diff == 0.0, "detail": f"max |difference| on this rank {diff:g}"})
    return checks


@contextmanager
def reporting_to(results: Any, rank: int) -> Iterator[None]:
    """The body of a benchmark rank: an error goes to the parent through ``results`` (then raised), and the
    process group is destroyed either way."""
    try:
        yield
    except BaseException as error:
        results.put({"rank": rank, "error": f"{type(error).__name__}: {error}"})
        raise
    finally:
        dist.destroy_process_group()


def rank_main(rank: int, world: int, port: int, config: BenchConfig, results: Any) -> None:
    """One rank: build every configuration, run them interleaved, send the records to the parent."""
    torch.set_num_threads(config.threads_per_rank)
    dist.init_process_group(
        BACKEND,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    with reporting_to(results, rank):
        counter, timer = CollectiveCounter(), CallTimer()
        counter.install()
        timer.install()
        base = make_gpt(MODEL, "cpu", SEED)
        batches = token_batches(MODEL, DISTINCT_BATCHES, SEED + 1 + rank)  # each rank its own
        trainers = [Trainer(c, base, world, config.init_scale, config.amp_dtype) for c in config.chosen()]
        warm, timed = interleave(
            trainers,
            lambda t: t.step(batches, counter, timer),
            config.warmup_steps,
            config.rounds,
            config.steps_per_round,
        )
        for t, warm_records, rounds in zip(trainers, warm, timed, strict=True):
            t.warmup, t.rounds = warm_records, rounds
        checks = final_checks(trainers, config.init_scale)
        counter.uninstall()
        timer.uninstall()
        entries = {t.config.name: len(t.inspector.entries) for t in trainers if t.inspector is not None}
        results.put(
            {
                "rank": rank,
                "warmup": {t.config.name: [asdict(s) for s in t.warmup] for t in trainers},
                "rounds": {t.config.name: [[asdict(s) for s in rs] for rs in t.rounds] for t in trainers},
                "checks": checks,
                "inspected_tensors": entries,
                "parameter_tensors": len(list(base.parameters())),
                "parameters": sum(p.numel() for p in base.parameters()),
            }
        )
        dist.barrier()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(config: BenchConfig) -> dict[int, dict[str, Any]]:
    """Spawns the ranks and returns their records, by rank."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [
        context.Process(target=rank_main, args=(r, config.world, port, config, results)) for r in range(config.world)
    ]
    for p in procs:
        p.start()
    by_rank: dict[int, dict[str, Any]] = {}
    try:
        while len(by_rank) < config.world:
            try:
                record = results.get(timeout=RESULT_TIMEOUT_S)
            except queue.Empty:
                raise RuntimeError(f"no result from the ranks within {RESULT_TIMEOUT_S:g} s") from None
            if "error" in record:
                raise RuntimeError(f"rank {record['rank']} failed: {record['error']}")
            by_rank[record["rank"]] = record
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return by_rank


# ---------------------------------------------------------------------------------------------- summary


@dataclass
class CategoryTraffic:
    """Per-step collectives of one category: calls and bytes (median over timed steps, and their range)."""

    calls: float
    bytes: float
    bytes_min: int
    bytes_max: int


@dataclass
class DistMeasurement(StepMeasurement):
    """The harness's StepMeasurement (rank 0's steps; its medians, quartiles and per-round ratios), plus the
    family, rank 1's steps, the time in the comm hook and in reduce_stats, and the all-reduce traffic."""

    family: str = ""
    step_ms_rank1: list[float] = field(default_factory=list)
    hook_ms: list[float] = field(default_factory=list)
    combine_ms: list[float] = field(default_factory=list)
    median_ms_rank1: float = 0.0
    fwd_bwd_median_ms: float = 0.0
    hook_median_ms: float = 0.0
    combine_median_ms: float = 0.0
    x_bare_paired_ci: tuple[float, float] | None = None  # ~95% confidence interval of the median ratio
    traffic_per_step: dict[str, CategoryTraffic] = field(default_factory=dict)  # timed steps, by category
    by_caller_per_step: dict[str, list[float]] = field(default_factory=dict)  # [calls, bytes], median
    one_time: dict[str, list[int]] = field(default_factory=dict)  # LAYOUT_CHECK over all steps: [calls, bytes]
    first_step: dict[str, list[int]] = field(default_factory=dict)  # warmup step 1, by category
    expected_inspection_bytes: int | None = None  # from the docstrings' formulas

    def __post_init__(self) -> None:
        super().__post_init__()
        self.median_ms_rank1 = statistics.median(self.step_ms_rank1)
        self.fwd_bwd_median_ms = statistics.median(self.fwd_bwd_ms)
        self.hook_median_ms = statistics.median(self.hook_ms)
        self.combine_median_ms = statistics.median(self.combine_ms)

    def compare(self, bare: StepMeasurement) -> None:
        super().compare(bare)
        assert isinstance(bare, DistMeasurement)
        self.x_bare_paired_ci = median_ci(paired_ratios(self.round_medians_ms, bare.round_medians_ms))
        self.direct_ms += self.hook_median_ms - bare.hook_median_ms  # the hook runs inside backward


@dataclass
class BenchResult:
    machine: dict[str, object]
    config: dict[str, object]
    model: dict[str, object]
    formulas: dict[str, str]
    measurements: list[DistMeasurement] = field(default_factory=list)
    checks: list[TargetCheck] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def ddp_table_bytes(world: int, tensors: int) -> int:
    """amp_inspect/distributed/ddp.py: 24 * T bytes per step, whatever the world (rank_record.py: SUM of int64
    [T], MAX of int64 [2, T]); ``world`` is only there to show that it does not count."""
    return 24 * tensors


def ddp_gather_bytes(gathered_tensors: int) -> int:
    """rank_record.py: on a step where 3+ ranks hold NaN/Inf in K tensors, each rank hands 8 * K bytes to one
    all_gather (and receives W times as many)."""
    return 8 * gathered_tensors


def ddp_table_bytes_before(world: int, tensors: int) -> int:
    """The hook before issue 32: 8 * W * T bytes per step (an int64 [world, T] table all-reduced)."""
    return 8 * world * tensors


def reduce_stats_bytes(tensors: int, formats: int) -> int:
    """amp_inspect/distributed/combine.py: 8 * T * (267 + 3F) bytes per reduce_stats call and mesh dimension,
    whatever the world (SUM float64 [T, 5 + 3F + 256 + 1 + 1]; MAX int64 [4 * T]: amax and -amin_nonzero as
    ordered integers, the record's two keys)."""
    return 8 * tensors * (267 + 3 * formats)


def reduce_stats_fetch_bytes(world: int, fetched_tensors: int) -> int:
    """combine.py: on a step where 3+ ranks hold NaN/Inf in K tensors, one SUM all-reduce of int64 [W, K]."""
    return 8 * world * fetched_tensors


def reduce_stats_bytes_before(world: int, tensors: int, formats: int) -> int:
    """reduce_stats before issue 32: 8 * T * (5 + 3F + 256 + 1 + W) + 8 * T bytes per call (a [W, T] block in
    the SUM buffer)."""
    return 8 * tensors * (5 + 3 * formats + 256 + 1 + world) + 8 * tensors


def layout_check_bytes(world: int) -> int:
    """amp_inspect/distributed/combine.py, check_same_layout: one all-reduce of 2 * world int64."""
    return 8 * 2 * world


def expected_inspection_bytes(config: DistConfig, world: int, tensors: int) -> int:
    hook = config.family == DDP and config.attach and config.ddp_hook
    combine = config.family == FSDP and config.attach
    return (ddp_table_bytes(world, tensors) if hook else 0) + (
        reduce_stats_bytes(tensors, len(FORMATS)) if combine else 0
    )


def traffic_of(steps: list[dict[str, Any]], category: str) -> CategoryTraffic:
    entries = [s["by_category"].get(category, [0, 0]) for s in steps]
    sizes = [e[1] for e in entries]
    return CategoryTraffic(statistics.median(e[0] for e in entries), statistics.median(sizes), min(sizes), max(sizes))


def summarize(by_rank: dict[int, dict[str, Any]], config: BenchConfig) -> list[DistMeasurement]:
    rank0, rank1 = by_rank[0], by_rank[1]
    tensors = rank0["parameter_tensors"]
    rows: list[DistMeasurement] = []
    for c in config.chosen():
        rounds = rank0["rounds"][c.name]
        steps = [s for rs in rounds for s in rs]
        warmup = rank0["warmup"][c.name]
        everything = warmup + steps
        m = DistMeasurement(
            c.name,
            c.description,
            step_ms=[s["total_ms"] for s in steps],
            fwd_bwd_ms=[s["fwd_bwd_ms"] for s in steps],
            check_ms=[s["check_ms"] for s in steps],
            opt_ms=[s["opt_ms"] for s in steps],
            round_medians_ms=[statistics.median(s["total_ms"] for s in rs) for rs in rounds],
            family=c.family,
            step_ms_rank1=[s["total_ms"] for rs in rank1["rounds"][c.name] for s in rs],
            hook_ms=[s["hook_ms"] for s in steps],
            combine_ms=[s["combine_ms"] for s in steps],
        )
        m.traffic_per_step = {cat: traffic_of(steps, cat) for cat in CATEGORIES}
        callers = sorted({k for s in steps for k in s["by_caller"]})
        m.by_caller_per_step = {
            k: [statistics.median(s["by_caller"].get(k, [0, 0])[i] for s in steps) for i in (0, 1)] for k in callers
        }
        m.one_time[LAYOUT_CHECK] = [
            sum(s["by_category"].get(LAYOUT_CHECK, [0, 0])[i] for s in everything) for i in (0, 1)
        ]
        m.first_step = warmup[0]["by_category"] if warmup else {}
        m.expected_inspection_bytes = expected_inspection_bytes(c, config.world, tensors)
        rows.append(m)
    by_name = {m.config: m for m in rows}
    for m in rows:
        m.compare(by_name[BARE_OF[m.family]])
    return rows


def gradient_bytes(parameters: int) -> int:
    return parameters * 4  # float32 gradients


def print_results(result: BenchResult, parameters: int) -> None:
    """Two tables. Time: rank 0's step (ms: median, IQR; ``rank1``: rank 1's median); medians of ``check()``,
    ``hook`` (the comm hook's work, inside backward), ``combine`` (reduce_stats, inside check() or
    scaler.step) and ``opt.step`` (scaler.step + update); ``direct``: check() + hook + opt.step beyond bare's,
    also as % of bare's median step; ``overhead``: median over rounds of the per-round ratio to the family's
    bare config, with a ~95% confidence interval of that median (order statistics). Bytes: all-reduced per
    step after warmup (medians over the timed steps; a * marks steps that differed), by the caller's category."""
    by_name = {m.config: m for m in result.measurements}
    rows = []
    for m in result.measurements:
        assert m.overhead_pct is not None and m.x_bare_paired_ci is not None
        assert m.direct_ms is not None
        lo, hi = ((x - 1) * 100 for x in m.x_bare_paired_ci)
        direct = f"{m.direct_ms:.2f} ({m.direct_ms / by_name[BARE_OF[m.family]].median_ms * 100:+.1f}%)"
        rows.append(
            [m.config, len(m.step_ms), f"{m.median_ms:.1f}", f"{m.q1_ms:.1f}-{m.q3_ms:.1f}", f"{m.median_ms_rank1:.1f}"]
            + [f"{m.check_median_ms:.2f}", f"{m.hook_median_ms:.2f}", f"{m.combine_median_ms:.2f}"]
            + [f"{m.opt_median_ms:.2f}", direct, f"{m.overhead_pct:+.1f}% [{lo:+.1f}, {hi:+.1f}]"]
        )
    headers = ["config", "steps", "median", "IQR", "rank1", "check()", "hook", "combine", "opt.step", "direct"]
    print_table(headers + ["overhead [95% CI]"], rows)
    print()
    rows = []
    for m in result.measurements:
        insp = m.traffic_per_step[INSPECTION]
        grads = m.traffic_per_step[DDP_GRADIENTS]
        torch_own = m.traffic_per_step[TORCH_OWN]
        once = m.one_time[LAYOUT_CHECK][1]
        rows.append(
            [m.config, f"{insp.bytes:,.0f}" + ("" if insp.bytes_min == insp.bytes_max else "*"), f"{insp.calls:g}"]
            + [f"{m.expected_inspection_bytes or 0:,}", once if once else "-"]
            + [f"{grads.bytes:,.0f} ({grads.calls:g})" if grads.calls else "-"]
            + [f"{torch_own.bytes:,.0f} ({torch_own.calls:g})" if torch_own.calls else "-"]
        )
    headers = ["config", "inspection B/step", "calls", "formula B", "once B", "hook gradient B/step (calls)"]
    print_table(headers + ["torch B/step (calls)"], rows)
    print(
        f"\nonce B: the layout check before the first combine (one all-reduce, in warmup, not in B/step). For scale: "
        f"{parameters:,} parameters = {gradient_bytes(parameters):,} B of float32 gradients per step, which DDP "
        "all-reduces (counted only when the comm hook does it) and FSDP2 reduce-scatters (not counted)."
    )


def check_results(rows: list[DistMeasurement], world: int, by_rank: dict[int, dict[str, Any]]) -> list[TargetCheck]:
    """Measured against expected: the inspection's bytes per step equal the docstrings' formulas, the hook's
    gradient traffic equals the float32 gradients, and the ranks' own checks (no skipped step, equal weights)."""
    checks = []
    parameters = by_rank[0]["parameters"]
    for m in rows:
        insp = m.traffic_per_step[INSPECTION]
        steady = insp.bytes_min == insp.bytes_max
        checks.append(
            TargetCheck(
                f"{m.config}: inspection bytes per step = formula",
                steady and insp.bytes == m.expected_inspection_bytes,
                f"measured {insp.bytes:,.0f} B ({insp.calls:g} calls; range {insp.bytes_min}-{insp.bytes_max}), "
                f"formula {m.expected_inspection_bytes:,} B",
            )
        )
        grads = m.traffic_per_step[DDP_GRADIENTS]
        if grads.calls:
            checks.append(
                TargetCheck(
                    f"{m.config}: hook's gradient all-reduce = float32 gradients",
                    grads.bytes == gradient_bytes(parameters),
                    f"{grads.bytes:,.0f} B in {grads.calls:g} buckets vs {gradient_bytes(parameters):,} B",
                )
            )
        once = m.one_time[LAYOUT_CHECK]
        if once[0]:
            checks.append(
                TargetCheck(
                    f"{m.config}: one layout check of {layout_check_bytes(world)} B",
                    once == [1, layout_check_bytes(world)],
                    f"{once[0]} call(s), {once[1]} B over all steps",
                )
            )
    for rank, record in sorted(by_rank.items()):
        for c in record["checks"]:
            checks.append(TargetCheck(f"rank {rank}: {c['name']}", bool(c["passed"]), str(c["detail"])))
    return checks


# ---------------------------------------------------------------------------------------------- --traffic

# The inspection's bytes per step against the world, for a healthy step, one where rank 1 alone makes an Inf in
# ln_f (tensor parallel: the rowwise weight), and one where every rank does:
# - DDP's comm hook and FSDP2's combine on a small model (the same 52 parameter tensors as MODEL), so that 8
#   processes fit on 2 cores; FSDP2 shards it per block and at the root (wrap());
# - tensor parallel's combine on a colwise + rowwise MLP (4 tensors; the rowwise bias replicated).
TRAFFIC_MODEL = ModelSpec(layers=4, d_model=64, heads=4, vocab=512, context=32, batch=2)
TP = "tp"
TRAFFIC_WORLDS = {DDP: (2, 4, 8), FSDP: (2, 4, 8), TP: (2, 4)}
TRAFFIC_STEPS = ("healthy", "rank 1 Inf", "every rank Inf")
FORMULA_WORLDS = (1024, 16384)
FORMULA_TENSORS = 1000  # the example


def traffic_model(
    family: str, world: int, rank: int
) -> tuple[nn.Module, Callable[[], torch.Tensor], Callable[[], None]]:
    """(the model the inspector is attached to, the step's loss, what puts an Inf into this rank's gradient after
    backward: FSDP2 and tensor parallel; DDP's is a hook on ln_f's weight, before the all-reduce)."""
    if family == TP:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        torch.manual_seed(SEED)
        mlp = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
        parallelize_module(mlp, init_device_mesh("cpu", (world,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(SEED + 1))

        def poison_tp() -> None:
            to_local(mlp[2].weight.grad).view(-1)[0] = float("inf")

        return mlp, lambda: mlp(x).square().mean(), poison_tp
    base = make_gpt(TRAFFIC_MODEL, "cpu", SEED)
    batch = token_batches(TRAFFIC_MODEL, 1, SEED + 1 + rank)[0]
    bare = next(c for c in CONFIGS if c.name == (DDP_BARE if family == DDP else FSDP_BARE))
    wrapped, model = wrap(bare, base, world)

    def poison() -> None:
        to_local(model.ln_f.weight.grad).view(-1)[0] = float("inf")

    return wrapped, lambda: next_token_loss(wrapped, batch, "cpu", torch.bfloat16), poison


def traffic_rank_main(rank: int, world: int, family: str, port: int, results: Any) -> None:
    """One rank of the --traffic run: three steps with the inspector, its collectives counted (the gradient
    buckets of DDP's hook and the one-time layout check apart)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        BACKEND, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    with reporting_to(results, rank):
        sent: list[tuple[str, int]] = []
        originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather")}

        def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
            def collective(*args: Any, **kwargs: Any) -> Any:
                caller = sys._getframe(1)
                piece = args[1] if name == "all_gather" else args[0]
                if caller.f_globals.get("__name__", "").startswith("amp_inspect") and caller.f_code.co_name not in (
                    *HOOK_FUNCTIONS,
                    LAYOUT_FUNCTION,
                ):
                    sent.append((name, piece.numel() * piece.element_size()))
                return original(*args, **kwargs)

            return collective

        for name, original in originals.items():
            setattr(dist, name, counted(name, original))
        step = [0]
        model, loss, poison = traffic_model(family, world, rank)
        inspector = amp_inspect.attach(model, formats=FORMATS)
        poisoned = {1: rank == 1, 2: True}
        if family == DDP:

            def inject(grad: torch.Tensor) -> torch.Tensor:
                if poisoned.get(step[0], False):
                    grad = grad.clone()
                    grad.view(-1)[0] = float("inf")
                return grad

            model.module.ln_f.weight.register_hook(inject)
        by_step, named = [], []
        for step[0] in range(len(TRAFFIC_STEPS)):
            loss().backward()
            if family != DDP and poisoned.get(step[0], False):
                poison()
            report = inspector.check()
            named.append(report.inf_by_rank)
            by_step.append(list(sent))
            sent.clear()
            model.zero_grad(set_to_none=True)  # no optimizer step: the weights stay finite
        inspector.detach()
        for name, original in originals.items():
            setattr(dist, name, original)
        tensors = len(list(model.parameters()))
        results.put({"rank": rank, "steps": by_step, "named": named, "tensors": tensors})
        dist.barrier()


def traffic_formula(family: str, world: int, tensors: int, step: int) -> tuple[int, int]:
    """(bytes per rank now, bytes before issue 32) of ``family`` at ``world`` ranks on TRAFFIC_STEPS[step]."""
    fetched = world >= 3 and step == 2  # 3+ ranks hold the Inf of one tensor: each rank's count of it is fetched
    if family == DDP:
        return ddp_table_bytes(world, tensors) + (ddp_gather_bytes(1) if fetched else 0), ddp_table_bytes_before(
            world, tensors
        )
    now = reduce_stats_bytes(tensors, len(FORMATS)) + (reduce_stats_fetch_bytes(world, 1) if fetched else 0)
    return now, reduce_stats_bytes_before(world, tensors, len(FORMATS))


def traffic_main() -> int:
    """--traffic: the inspection's bytes per step at 2, 4 and 8 ranks (measured) and at 1,024 and 16,384
    (formula): DDP's hook, FSDP2's combine, tensor parallel's combine."""
    print(
        "# bytes each rank hands to amp_inspect's collectives per step (DDP's gradient buckets, the layout check apart)"
    )
    rows, checks = [], []
    tensors_of: dict[str, int] = {}
    for family, worlds in TRAFFIC_WORLDS.items():
        for world in worlds:
            context = mp.get_context("spawn")
            results = context.Queue()
            port = free_port()
            procs = [
                context.Process(target=traffic_rank_main, args=(r, world, family, port, results)) for r in range(world)
            ]
            start = time.perf_counter()
            for p in procs:
                p.start()
            by_rank = {}
            while len(by_rank) < world:
                record = results.get(timeout=RESULT_TIMEOUT_S)
                if "error" in record:
                    raise RuntimeError(f"{family}: rank {record['rank']} of {world} failed: {record['error']}")
                by_rank[record["rank"]] = record
            for p in procs:
                p.join(timeout=60)
            elapsed = time.perf_counter() - start
            tensors = tensors_of[family] = by_rank[0]["tensors"]
            for s, what in enumerate(TRAFFIC_STEPS):
                calls = by_rank[0]["steps"][s]
                measured = sum(b for _, b in calls)
                formula, before = traffic_formula(family, world, tensors, s)
                same = all(r["steps"][s] == calls for r in by_rank.values())
                rows.append(
                    [family, str(world), str(tensors), what, f"{measured:,}", ", ".join(f"{n} {b}" for n, b in calls)]
                    + [f"{formula:,}", f"{before:,}", str(by_rank[0]["named"][s])]
                )
                checks.append(
                    TargetCheck(f"{family}, {world} ranks, {what}: bytes = formula", measured == formula and same, "")
                )
            print(f"# {family} on {world} ranks ran {elapsed:.0f} s", flush=True)
    headers = ["family", "W", "T", "step", "measured B", "calls (B each)", "formula B", "before B", "inf_by_rank"]
    print_table(headers, rows)
    print()
    print(
        "# formula per healthy step (T = tensors, F = formats): DDP hook 24 * T (before: 8 * W * T); combine "
        f"8 * T * (267 + 3F) per mesh dimension (before: 8 * T * (263 + 3F + W)). F = {len(FORMATS)} here."
    )
    for family, tensors in (*tensors_of.items(), (DDP, FORMULA_TENSORS), (FSDP, FORMULA_TENSORS)):
        for world in FORMULA_WORLDS:
            now, before = traffic_formula(family, world, tensors, 0)
            fetch = "8 * K" if family == DDP else f"8 * {world:,} * K"
            print(
                f"#   {family}, W = {world:,}, T = {tensors:,}: {now:,} B per step (before: {before:,} B); "
                f"a step fetching K tensors adds {fetch} B per rank"
            )
    print()
    print_checks(checks)
    return 0 if all(c.passed for c in checks) else 1


def parse_args(argv: Sequence[str] | None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke test: few rounds and steps, no JSON")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 60; quick: 2)")
    parser.add_argument("--steps-per-round", type=int, default=None, help="steps per config and round (default 1)")
    parser.add_argument("--out", type=Path, default=None, help=f"JSON folder (default {RESULTS_DIR}; quick: none)")
    parser.add_argument(
        "--traffic",
        action="store_true",
        help="only the inspection's bytes per step (DDP hook, FSDP2 and TP combine) at 2-8 ranks (no JSON)",
    )
    parser.add_argument(
        "--amp-dtype",
        choices=AMP_DTYPES,
        default=AMP_DTYPES[0],
        help="the forward's autocast dtype (float32: no autocast, for a CPU without bf16 matmul instructions, "
        "where bf16 is emulated tens of times slower than float32; default bfloat16)",
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=[c.name for c in CONFIGS],
        default=[],
        help="time only these (and their families' bare baselines; default: all)",
    )
    args = parser.parse_args(argv)
    out_dir = args.out if args.out is not None or args.quick else RESULTS_DIR
    rounds, steps, warmup = (2, 1, 2) if args.quick else (60, 1, 3)
    return BenchConfig(
        args.quick,
        out_dir,
        WORLD,
        THREADS_PER_RANK,
        warmup_steps=warmup,
        rounds=args.rounds or rounds,
        steps_per_round=args.steps_per_round or steps,
        init_scale=INIT_SCALE,
        amp_dtype=args.amp_dtype,
        configs=tuple(args.configs),
    )


def main(argv: Sequence[str] | None = None) -> int:
    if "--traffic" in (sys.argv[1:] if argv is None else argv):
        return traffic_main()
    config = parse_args(argv)
    if not dist.is_available() or not dist.is_gloo_available():
        print("error: this torch has no gloo backend")
        return 2
    if not _ops.has_kernel("cpu"):
        print("warning: amp_inspect has no compiled cpu kernel; the inspection runs the reference")
    machine = machine_info("cpu")
    machine["torch_threads"] = config.threads_per_rank  # per rank, set in each process
    machine["world"] = config.world
    machine["backend"] = BACKEND
    machine["amp_dtype"] = config.amp_dtype
    print(
        f"# GPT {MODEL.layers}x{MODEL.d_model}, {MODEL.heads} heads, vocab {MODEL.vocab}, context {MODEL.context}, "
        f"tied embeddings; batch {MODEL.batch}x{MODEL.context} per rank; {config.world} ranks on {BACKEND}, "
        f"{config.threads_per_rank} thread each; {autocast_words(config.amp_dtype)}, "
        f"GradScaler(init_scale {config.init_scale:g}), AdamW",
        flush=True,
    )
    print(
        f"# {len(config.chosen())} configs interleaved: {config.warmup_steps} warmup steps each, then "
        f"{config.rounds} rounds x {config.steps_per_round} steps each; "
        f"load average before {machine['load_average_before']}",
        flush=True,
    )
    start = time.perf_counter()
    by_rank = run_ranks(config)
    elapsed = time.perf_counter() - start
    machine["load_average_after"] = load_average()
    parameters = by_rank[0]["parameters"]
    tensors = by_rank[0]["parameter_tensors"]
    model_info: dict[str, object] = {
        **asdict(MODEL),
        "parameters": parameters,
        "parameter_tensors": tensors,
        "inspected_tensors": by_rank[0]["inspected_tensors"],
        "gradient_bytes": gradient_bytes(parameters),
    }
    formulas = {
        "ddp_hook_per_step": f"24 * T = 24 * {tensors} = {ddp_table_bytes(config.world, tensors)}",
        "reduce_stats_per_step": (
            f"8 * T * (267 + 3F) with T={tensors}, F={len(FORMATS)} = {reduce_stats_bytes(tensors, len(FORMATS))}"
        ),
        "layout_check_once": f"8 * 2 * W = {layout_check_bytes(config.world)}",
    }
    result = BenchResult(machine, {k: str(v) for k, v in asdict(config).items()}, model_info, formulas)
    result.config["wall_s"] = f"{elapsed:.1f}"
    result.measurements = summarize(by_rank, config)
    result.checks = check_results(result.measurements, config.world, by_rank)

    print(f"# {parameters:,} parameters in {tensors} tensors; ranks ran {elapsed:.0f} s")
    for name, text in formulas.items():
        print(f"# formula {name}: {text}")
    print()
    print_results(result, parameters)
    print()
    print_checks(result.checks)
    widest = max(
        (m.x_bare_paired_ci[1] - m.x_bare_paired_ci[0]) * 50.0
        for m in result.measurements
        if m.x_bare_paired_ci is not None
    )
    load_before, load_after = machine["load_average_before"], machine["load_average_after"]
    note = (
        f"noise: the widest overhead interval is +-{widest:.1f}%; load average {load_before} before, "
        f"{load_after} after (the after value includes this benchmark's own {config.world} busy ranks; "
        f"{machine['cpu_count']} CPUs)"
    )
    if widest > NOISY_CI_HALF_WIDTH_PCT or (isinstance(load_before, tuple | list) and load_before[0] > 1.0):
        note += (
            ": noisy, overheads of a few percent are within the noise; read the direct column, or rerun with more "
            "--rounds on a quiet machine"
        )
    result.notes.append(note)
    print(f"note: {note}")
    if config.out_dir is not None:
        stem = STEM if config.amp_dtype == AMP_DTYPES[0] else f"{STEM}_{config.amp_dtype}"
        write_result(result, config.out_dir, stem, config.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
