"""Multi-process scenarios for tests/test_distributed.py, run as ``python -m tests.dist_scenarios NAME WORLD
PORT OUT_DIR`` from the repository root (a subprocess with a timeout, so a hung collective fails a test
instead of hanging the suite). Each rank runs the scenario on gloo (CPU) and writes OUT_DIR/<name>.<rank>
with "OK" or its failure; a scenario's assertions run on every rank.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import os
import sys
import time
import traceback
import weakref
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import amp_inspect
from amp_inspect.distributed.combine import Combiner, DistributedInspectionError, reduce_stats
from tests import models

STEPS = 4
INF_STEP = 1  # the step on which rank 1 alone produces an Inf
TIMEOUT_S = 60.0


def _inject_inf(param: nn.Parameter, step_of: Callable[[], int], on_rank: int = 1) -> None:
    """On rank ``on_rank`` only, the gradient of ``param`` gets one +Inf on step INF_STEP, before DDP sees it."""
    if dist.get_rank() != on_rank:
        return

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if step_of() != INF_STEP:
            return grad
        grad = grad.clone()
        grad.view(-1)[0] = float("inf")
        return grad

    param.register_hook(hook)


def ddp(world: int, out: Path) -> None:
    """DDP with Inf made on rank 1 only: the report names rank 1 and the module on every rank; training is
    bitwise that of DDP without the hook (with GradScaler, the hook registered by attach or by hand, and with
    InspectingGradScaler, and with gradient_as_bucket_view, where DDP divides instead of multiplying); the log
    is written once (rank 0), or once per rank when asked."""
    rank = dist.get_rank()
    step = [0]
    variants = {}
    reference_of = {"hooked": "plain", "manual": "plain", "inspecting": "plain", "hooked_view": "plain_view"}
    for kind in ("plain", "hooked", "manual", "inspecting", "plain_view", "hooked_view"):
        model = models.gpt()
        _inject_inf(model.ln_f.weight, lambda: step[0])
        wrapped = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=kind.endswith("_view"))
        scaler_type = amp_inspect.InspectingGradScaler if kind == "inspecting" else torch.amp.GradScaler
        scaler = scaler_type("cpu", init_scale=2.0**10)
        insp = None
        if kind == "hooked_view":
            insp = amp_inspect.attach(wrapped, scaler, timeout=TIMEOUT_S)
        elif kind == "hooked":
            insp = amp_inspect.attach(wrapped, scaler, log=out / "run.jsonl", timeout=TIMEOUT_S)
            assert wrapped._comm_hooks, "attach(ddp_model) registers the comm hook"
        elif kind == "manual":  # the hook registered by hand, as the README shows
            insp = amp_inspect.attach(wrapped, scaler, ddp_hook=False, timeout=TIMEOUT_S)
            assert not wrapped._comm_hooks
            wrapped.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)
        elif kind == "inspecting":
            insp = amp_inspect.attach(wrapped, scaler, log=out / "all.jsonl", log_all_ranks=True, timeout=TIMEOUT_S)
        variants[kind] = (model, wrapped, scaler, torch.optim.SGD(model.parameters(), lr=0.1), insp)

    for step[0] in range(STEPS):
        for kind, (_, wrapped, scaler, opt, insp) in variants.items():
            inputs, targets = models.batch_for(wrapped.module, step[0] * world + rank)  # each rank its own batch
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = wrapped(inputs)
            loss = nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())
            scaler.scale(loss).backward()
            if kind in ("hooked", "manual", "hooked_view"):
                insp.check()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=not kind.endswith("_view"))  # keep .grad in its bucket: DDP divides then
            if insp is None:
                continue
            report = insp.last_report
            assert report.step == step[0], (kind, report.step, step[0])
            if step[0] == INF_STEP:
                assert report.found_inf and report.offenders == ["ln_f"], (kind, report.offenders)
                assert report.inf_by_rank == {1: {"ln_f": 1}}, (kind, report.inf_by_rank)
                assert report.ranks_with_inf == [1]
                assert "NaN/Inf came from rank 1: ln_f (1)" in str(report)
            else:
                assert report.inf_by_rank == {} and not report.found_inf, (kind, step[0], report.inf_by_rank)

    for kind, reference_kind in reference_of.items():
        model, _, scaler, _, insp = variants[kind]
        reference = variants[reference_kind][0]
        for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
            assert torch.equal(p, q), f"{kind}: {name} differs from DDP without the hook"
        assert scaler.get_scale() == variants[reference_kind][2].get_scale()
        assert [r.ranks_with_inf for r in insp.history] == [[1] if s == INF_STEP else [] for s in range(STEPS)]
        insp.detach()

    # After detach() the registered hooks only average: one more step, still bitwise DDP's, nothing counted.
    for _, wrapped, scaler, opt, _ in variants.values():
        inputs, targets = models.batch_for(wrapped.module, STEPS * world + rank)
        loss = nn.functional.cross_entropy(wrapped(inputs).flatten(0, -2), targets.flatten())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    for kind in ("hooked", "manual", "hooked_view"):
        model, *_, insp = variants[kind]
        reference = variants[reference_of[kind]][0]
        assert insp._ddp.counts._pending is None and insp._ddp.counts._counts is None
        assert all(torch.equal(p, q) for p, q in zip(model.parameters(), reference.parameters(), strict=True))


class _Traffic:
    """Counts the bytes the DDP hook's inspection hands to all_reduce and all_gather in this process (the
    tensor's numel * element size per call; all_gather: this rank's piece), apart from the gradient buckets."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []  # (collective, bytes)
        self._originals = {name: getattr(dist, name) for name in ("all_reduce", "all_gather")}
        for name, original in self._originals.items():
            setattr(dist, name, self._counted(name, original))

    def _counted(self, name: str, original: Callable[..., object]) -> Callable[..., object]:
        def collective(*args: object, **kwargs: object) -> object:
            caller = sys._getframe(1)
            piece = args[1] if name == "all_gather" else args[0]
            if caller.f_globals.get("__name__", "").startswith("amp_inspect") and caller.f_code.co_name != "average":
                assert isinstance(piece, torch.Tensor)
                self.calls.append((name, piece.numel() * piece.element_size()))
            return original(*args, **kwargs)

        return collective

    def take(self) -> list[tuple[str, int]]:
        calls, self.calls = self.calls, []
        return calls

    def remove(self) -> None:
        for name, original in self._originals.items():
            setattr(dist, name, original)


def ddp_traffic(world: int, out: Path) -> None:
    """The DDP hook's bytes per step: a healthy step and a step where rank 1 alone makes an Inf cost 24 bytes per
    parameter tensor whatever the world (one SUM all-reduce of int64 [T], one MAX of int64 [2, T]); a step where
    every rank makes an Inf in ln_f adds, on three ranks or more, one all-gather of this rank's count of that one
    tensor (8 bytes), once; two ranks are still named from the record. The reports name the ranks as ever.
    Then the same with the record read one backward later, as on CUDA tensors: a report read before then names
    the lowest and highest rank; the gather runs in the next backward and the report names all of them."""
    from amp_inspect.distributed import ddp as ddp_module

    rank = dist.get_rank()
    step = [0]
    everywhere = 2  # the step on which every rank makes an Inf
    model = models.gpt()

    def inject(grad: torch.Tensor) -> torch.Tensor:
        if step[0] == everywhere or (step[0] == INF_STEP and rank == 1):
            grad = grad.clone()
            grad.view(-1)[0] = float("inf")
        return grad

    model.ln_f.weight.register_hook(inject)
    wrapped = nn.parallel.DistributedDataParallel(model)
    tensors = len(list(model.parameters()))
    expected = {0: {}, INF_STEP: {1: {"ln_f": 1}}, everywhere: {r: {"ln_f": 1} for r in range(world)}, 3: {}}
    read_at_take_of_cpu = getattr(ddp_module, "_read_at_take", None)
    traffic = _Traffic()
    try:
        for read_at_take in (True, False):
            if not read_at_take:
                ddp_module._read_at_take = lambda device: False
            insp = amp_inspect.attach(wrapped, timeout=TIMEOUT_S)
            finalized: dict[int, object] = {}
            insp.add_listener(lambda r, into=finalized: into.__setitem__(r.step, r.inf_by_rank))
            measured = {}
            for step[0] in range(4):
                inputs, targets = models.batch_for(model, step[0] * world + rank)
                nn.functional.cross_entropy(wrapped(inputs).flatten(0, -2), targets.flatten()).backward()
                report = insp.check()
                measured[step[0]] = traffic.take()
                if read_at_take or step[0] != everywhere or world < 3:
                    assert report.inf_by_rank == expected[step[0]], (read_at_take, step[0], report.inf_by_rank)
                else:  # the gather comes in the next backward: until then the lowest and highest rank
                    assert not report.ready()
                    partial = {0: {"ln_f": 1}, world - 1: {"ln_f": 1}}
                    assert report.inf_by_rank == partial, report.inf_by_rank
                model.zero_grad(set_to_none=True)  # no optimizer step: the weights stay finite
            insp.detach()
            assert finalized == expected, (read_at_take, finalized)
            record = [("all_reduce", 8 * tensors), ("all_reduce", 16 * tensors)]
            gather = [("all_gather", 8)] if world >= 3 else []
            for s, calls in measured.items():
                if read_at_take:
                    want = record + (gather if s == everywhere else [])
                else:  # decided in step 3's backward, before its record
                    want = (gather if s == everywhere + 1 else []) + record
                assert calls == want, (read_at_take, s, calls, want)
            if rank == 0:
                (out / f"traffic.{int(read_at_take)}.{world}").write_text(repr(measured))
    finally:
        traffic.remove()
        if read_at_take_of_cpu is not None:
            ddp_module._read_at_take = read_at_take_of_cpu


def ddp_views(world: int, out: Path) -> None:
    """gradient_as_bucket_view on a world that is not a power of two, where DDP divides a gradient that lives
    in its bucket and multiplies one it copies: the hook's averaging is bitwise DDP's in the loops that decide
    which (zero_grad between forward and backward, no_sync accumulation with and without set_to_none, the hook
    registered by hand)."""
    rank = dist.get_rank()

    def train(style: str, hooked: bool) -> nn.Module:
        model = models.gpt()
        wrapped = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        insp = None
        if hooked and style == "manual":
            insp = amp_inspect.attach(wrapped, ddp_hook=False, timeout=TIMEOUT_S)
            wrapped.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)
        elif hooked:
            insp = amp_inspect.attach(wrapped, timeout=TIMEOUT_S)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        keep = style in ("no_sync_keep", "manual")  # zero_grad(set_to_none=False): .grad stays in its bucket
        for step in range(3):
            micro = 2 if style.startswith("no_sync") else 1
            for m in range(micro):
                inputs, targets = models.batch_for(model, (step * micro + m) * world + rank)
                with wrapped.no_sync() if m < micro - 1 else contextlib.nullcontext():
                    loss = nn.functional.cross_entropy(wrapped(inputs).flatten(0, -2), targets.flatten())
                    if style == "zero_between":
                        opt.zero_grad(set_to_none=True)  # after the forward, before the backward
                    loss.backward()
            if insp is not None:
                insp.check()
            opt.step()
            if style != "zero_between":
                opt.zero_grad(set_to_none=not keep)
        if insp is not None:
            insp.detach()
        return model

    for style in ("keep", "zero_between", "no_sync_none", "no_sync_keep", "manual"):
        plain, hooked = train(style, False), train(style, True)
        for (name, p), q in zip(hooked.named_parameters(), plain.parameters(), strict=True):
            assert torch.equal(p, q), f"{style}: {name} differs from DDP without the hook"


def ddp_more(world: int, out: Path) -> None:
    """The DDP hook with gradient accumulation (with and without no_sync: an Inf made on rank 1 in the first
    micro-batch is still traced to rank 1 alone), every=3 (a skipped step between checks is still traced),
    attach() again after detach() (the hook is rebound), and group= that is not DDP's process group (an
    error)."""
    rank = dist.get_rank()
    micro_step = [0]
    model = models.gpt()
    _inject_inf(model.ln_f.weight, lambda: micro_step[0])  # Inf on rank 1 when micro_step == INF_STEP
    wrapped = nn.parallel.DistributedDataParallel(model)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def run(insp: amp_inspect.Inspector, step: int, no_sync: bool) -> amp_inspect.StepReport | None:
        for m in range(2):  # two micro-batches; on INF_STEP the Inf comes in the first one
            micro_step[0] = INF_STEP if (step == INF_STEP and m == 0) else -1
            with wrapped.no_sync() if (no_sync and m == 0) else contextlib.nullcontext():
                inputs, targets = models.batch_for(model, (step * 2 + m) * world + rank)
                loss = nn.functional.cross_entropy(wrapped(inputs).flatten(0, -2), targets.flatten()) / 2
                scaler.scale(loss).backward()
        report = insp.check()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        return report

    for no_sync in (False, True):
        insp = amp_inspect.attach(wrapped, scaler, timeout=TIMEOUT_S)
        for step in range(STEPS):
            report = run(insp, step, no_sync)
            expected = {1: {"ln_f": 1}} if step == INF_STEP else {}
            assert report.inf_by_rank == expected, (no_sync, step, report.inf_by_rank)
        insp.detach()  # the next attach rebinds the registered hook

    insp = amp_inspect.attach(wrapped, scaler, every=3, timeout=TIMEOUT_S)
    traced = {}
    insp.add_listener(lambda r: traced.__setitem__(r.step, r.inf_by_rank))
    for step in range(STEPS):
        run(insp, step, no_sync=False)
    insp.close()
    assert traced == {0: {}, INF_STEP: {1: {"ln_f": 1}}, 3: {}}, traced  # step 1 skipped between checks
    insp.detach()

    other = dist.new_group([0])  # every rank creates it; it is not DDP's group
    try:
        amp_inspect.attach(wrapped, group=other)
    except ValueError as error:
        assert "DDP model's process group" in str(error)
    else:
        raise AssertionError("group= other than DDP's was accepted")


def ddp_cuda(world: int, out: Path) -> None:
    """The hook's CUDA path (fp16 autocast, GradScaler("cuda")), the ranks sharing GPU 0 and gloo carrying the
    CUDA tensors (NCCL needs one GPU per rank): rank 1 named on every rank, training bitwise DDP's."""
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    step = [0]
    runs = {}
    for kind in ("plain", "hooked"):
        model = models.gpt().cuda()
        _inject_inf(model.ln_f.weight, lambda: step[0])
        wrapped = nn.parallel.DistributedDataParallel(model, device_ids=[0])
        scaler = torch.amp.GradScaler("cuda", init_scale=2.0**10)
        insp = amp_inspect.attach(wrapped, scaler, timeout=TIMEOUT_S) if kind == "hooked" else None
        runs[kind] = (model, wrapped, scaler, torch.optim.SGD(model.parameters(), lr=0.1), insp)
    for step[0] in range(STEPS):
        for model, wrapped, scaler, opt, insp in runs.values():
            inputs, targets = (t.cuda() for t in models.batch_for(model, step[0] * world + rank))
            with torch.autocast("cuda", dtype=torch.float16):
                logits = wrapped(inputs)
            scaler.scale(nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())).backward()
            report = insp.check() if insp is not None else None
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if report is not None:
                expected = {1: {"ln_f": 1}} if step[0] == INF_STEP else {}
                assert report.inf_by_rank == expected, (step[0], report.inf_by_rank)
    for p, q in zip(runs["hooked"][0].parameters(), runs["plain"][0].parameters(), strict=True):
        assert torch.equal(p, q)


def ddp_teardown(world: int, out: Path) -> None:
    """The hook's state must not tie the DDP model into a cycle through DDP's C++ reducer, which Python's
    collector cannot free (it then tears down after the process group at exit: gloo was seen to abort).
    With the hook registered by attach or by hand, the model and the inspector are freed like any objects."""

    def train(by_hand: bool) -> list[weakref.ref]:
        model = models.gpt()
        wrapped = nn.parallel.DistributedDataParallel(model)
        scaler = torch.amp.GradScaler("cpu")
        insp = amp_inspect.attach(wrapped, scaler, ddp_hook=not by_hand, timeout=TIMEOUT_S)
        if by_hand:
            wrapped.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)
        inputs, targets = models.batch_for(model, dist.get_rank())
        scaler.scale(nn.functional.cross_entropy(wrapped(inputs).flatten(0, -2), targets.flatten())).backward()
        assert insp.check().inf_by_rank == {}
        return [weakref.ref(wrapped), weakref.ref(insp)]

    for by_hand in (False, True):
        refs = train(by_hand)
        gc.collect()
        assert all(r() is None for r in refs), f"by_hand={by_hand}: still alive after collection"


def ddp_groups(world: int, out: Path) -> None:
    """DDP over two subgroups, {0, 1} and {2, 3}, as with pipeline or hybrid parallelism: the Inf made on
    global rank 3 is named as rank 3 (a global rank) in its group's reports; the other group stays clean.
    Ranks 0 and 1 pass their group as ``group=``, ranks 2 and 3 rely on DDP's process group."""
    rank = dist.get_rank()
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    mine = groups[rank // 2]
    step = [0]
    model = models.gpt()
    _inject_inf(model.ln_f.weight, lambda: step[0], on_rank=3)
    wrapped = nn.parallel.DistributedDataParallel(model, process_group=mine)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    log = out / "run.jsonl"  # each group's first rank writes its group's reports: run.rank0 and run.rank2
    insp = amp_inspect.attach(wrapped, scaler, group=mine if rank < 2 else None, log=log, timeout=TIMEOUT_S)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step[0] in range(STEPS):
        inputs, targets = models.batch_for(model, step[0] * world + rank)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = wrapped(inputs)
        scaler.scale(nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())).backward()
        report = insp.check()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        expected = {3: {"ln_f": 1}} if step[0] == INF_STEP and rank >= 2 else {}
        assert report.inf_by_rank == expected, (step[0], report.inf_by_rank)
        assert report.found_inf == bool(expected)
    insp.detach()


def _fsdp_model(world: int, mesh_shape: tuple[int, ...] | None = None) -> tuple[nn.Module, nn.Module]:
    """(model sharded with fully_shard over the world, an unsharded copy of the same initial weights); a 2-D
    ``mesh_shape`` (replicate, shard) gives HSDP."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    names = ("replicate", "shard") if mesh_shape and len(mesh_shape) == 2 else None
    mesh = init_device_mesh("cpu", mesh_shape or (world,), mesh_dim_names=names)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    reference = copy.deepcopy(model)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, reference


def _batch(step: int) -> torch.Tensor:
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(step))


def _assert_same_modules(report: amp_inspect.StepReport, whole: amp_inspect.StepReport) -> None:
    """Combined statistics equal the unsharded model's: counts exactly, amax and norms to float rounding (the
    sharded run sums its gradients in another order)."""
    assert set(report.by_module) == set(whole.by_module)
    for name, expected in whole.by_module.items():
        got = report.by_module[name]
        for key in ("numel", "nan", "posinf", "neginf", "zero", "overflow", "underflow", "subnormal"):
            assert got[key] == expected[key], (name, key, got[key], expected[key])
        for key in ("amax", "grad_norm"):
            assert abs(got[key] - expected[key]) <= 1e-5 * expected[key], (name, key, got[key], expected[key])


def hsdp(world: int, out: Path) -> None:
    """HSDP (a (replicate, shard) mesh): statistics combined over the shard group equal the unsharded model's,
    and an Inf in the shard at shard coordinate 1 is named by its global rank (1 or 3, per replica)."""
    rank = dist.get_rank()
    model, reference = _fsdp_model(world, mesh_shape=(2, world // 2))
    insp = amp_inspect.attach(model, timeout=TIMEOUT_S)
    x = _batch(0)
    model(x.tensor_split(world)[rank]).pow(2).mean().backward()
    reference(x).pow(2).mean().backward()
    _assert_same_modules(insp.check(), amp_inspect.attach(reference).check())
    if rank % 2 == 1:  # the same shard of both replicas (after HSDP's all-reduce the replicas agree)
        model[2].weight.grad.to_local()[0, 0] = float("inf")
    report = insp.check()
    assert report.inf_by_rank == {2 * (rank // 2) + 1: {"2": 1}}, report.inf_by_rank
    insp.detach()


def fsdp2(world: int, out: Path) -> None:
    """FSDP2: the combined statistics equal those of the unsharded model on the whole batch; an Inf in rank
    1's shard is named on every rank; InspectingGradScaler skips that step on every rank, as GradScaler does."""
    rank = dist.get_rank()
    model, reference = _fsdp_model(world)
    insp = amp_inspect.attach(model, timeout=TIMEOUT_S)
    x = _batch(0)
    model(x.tensor_split(world)[rank]).pow(2).mean().backward()  # FSDP2 averages the ranks' gradients
    reference(x).pow(2).mean().backward()
    report = insp.check()
    assert report.inf_by_rank == {}
    _assert_same_modules(report, amp_inspect.attach(reference).check())
    insp.detach()

    # InspectingGradScaler on DTensor gradients against GradScaler on an identical FSDP2 model.
    runs = {}
    for kind in ("plain", "inspecting"):
        sharded, _ = _fsdp_model(world)
        scaler_type = amp_inspect.InspectingGradScaler if kind == "inspecting" else torch.amp.GradScaler
        scaler = scaler_type("cpu", init_scale=2.0**4)
        inspector = amp_inspect.attach(sharded, scaler, timeout=TIMEOUT_S) if kind == "inspecting" else None
        runs[kind] = (sharded, scaler, torch.optim.SGD(sharded.parameters(), lr=0.1), inspector)
    for step in range(STEPS):
        for sharded, scaler, opt, inspector in runs.values():
            scaler.scale(sharded(_batch(step).tensor_split(world)[rank]).pow(2).mean()).backward()
            if step == INF_STEP and rank == 1:
                sharded[2].weight.grad.to_local()[0, 0] = float("inf")  # only in rank 1's shard
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            if inspector is not None:
                report = inspector.last_report
                assert report.by_module["0"]["numel"] == 16 * 8 + 16, report.by_module["0"]
                expected = {1: {"2": 1}} if step == INF_STEP else {}
                assert report.inf_by_rank == expected and report.found_inf == (step == INF_STEP), report.inf_by_rank
    (plain, plain_scaler, _, _), (inspected, scaler, _, inspector) = runs["plain"], runs["inspecting"]
    assert scaler.get_scale() == plain_scaler.get_scale() == 2.0**3  # one backoff, on every rank
    for p, q in zip(inspected.parameters(), plain.parameters(), strict=True):
        assert torch.equal(p.full_tensor(), q.full_tensor())
    inspector.detach()


def shards(world: int, out: Path) -> None:
    """reduce_stats: each rank's slice of three tensors combines into exactly the whole tensors' statistics,
    and the rank that held the Inf is named."""
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-8, 6, (n,), generator=g) for n in (10, 4097, 33)]
    full[1][3000] = float("inf")  # in the last rank's slice
    formats = ("fp16", "bf16")
    merged = reduce_stats(amp_inspect.tensor_stats([t.tensor_split(world)[rank] for t in full], formats=formats))
    whole = amp_inspect.tensor_stats(full, formats=formats)
    for name in ("numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow", "amax"):
        assert torch.equal(getattr(merged.stats, name), getattr(whole, name)), name
    assert torch.equal(merged.stats.amin_nonzero, whole.amin_nonzero) and torch.equal(merged.stats.hist, whole.hist)
    torch.testing.assert_close(merged.stats.sumsq, whole.sumsq, rtol=1e-6, atol=0)
    expected = torch.zeros(world, 3, dtype=torch.int64)
    expected[world - 1, 1] = 1
    assert torch.equal(merged.nonfinite_by_rank, expected), merged.nonfinite_by_rank
    assert merged.ranks_with_inf.tolist() == [r == world - 1 for r in range(world)]


def shards_cuda(world: int, out: Path) -> None:
    """reduce_stats on CUDA tensors (issue 32, item 5: the code path NCCL takes; gloo carries the CUDA tensors here,
    the ranks sharing GPU 0): each rank's slice combines into the whole tensors' statistics; the record stays on
    the device; every rank holds Infs in one tensor (rank r: r + 1), so on three ranks the per-rank counts are
    fetched; read at once, and through the Combiner at its next combine (no host sync in between)."""
    rank = dist.get_rank()
    torch.cuda.set_device(0)
    g = torch.Generator().manual_seed(0)
    full = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-8, 6, (n,), generator=g) for n in (10, 4097, 33)]
    pieces = [t.tensor_split(world) for t in full]
    for r in range(world):
        pieces[1][r][: r + 1] = float("inf")  # a view: the whole tensor holds them too
    formats = ("fp16", "bf16")
    mine = [p[rank].cuda() for p in pieces]
    whole = amp_inspect.tensor_stats(full, formats=formats)
    expected = torch.zeros(world, 3, dtype=torch.int64)
    expected[:, 1] = torch.arange(1, world + 1)
    merged = reduce_stats(amp_inspect.tensor_stats(mine, formats=formats))
    combiner = Combiner(None, TIMEOUT_S)
    deferred = combiner.combine(amp_inspect.tensor_stats(mine, formats=formats), [t.shape for t in full])
    assert deferred.totals.device.type == mine[0].device.type  # the record's sums stay on the device
    combiner.combine(amp_inspect.tensor_stats(mine, formats=formats), [t.shape for t in full])  # decides the first
    for result in (merged, deferred):
        for name in ("numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow", "amax"):
            assert torch.equal(getattr(result.stats, name).cpu(), getattr(whole, name)), name
        assert torch.equal(result.stats.hist.cpu(), whole.hist)
        torch.testing.assert_close(result.stats.sumsq.cpu(), whole.sumsq, rtol=1e-6, atol=0)
        assert torch.equal(result.nonfinite_by_rank, expected), result.nonfinite_by_rank


def record_bytes(tensors: int, formats: int) -> list[tuple[str, int]]:
    """reduce_stats' collectives over one group (amp_inspect/distributed/combine.py), whatever the world: SUM of the
    float64 buffer (counts 5 + 3F, histogram 256, sum of squares 1, this rank's NaN/Inf count 1, per tensor), MAX of
    one int64 buffer (amax and -amin_nonzero as ordered integers, the record's two keys): 8 * T * (267 + 3F) bytes."""
    summed = 8 * tensors * (5 + 3 * formats + 256 + 1 + 1)
    return [("all_reduce", summed), ("all_reduce", 32 * tensors)]


def fsdp_traffic(world: int, out: Path) -> None:
    """FSDP2's combine, bytes per step: a healthy step and one where rank 1 alone holds an Inf cost the same
    whatever the world (record_bytes: 4 tensors, 1 format); a step where every rank holds Infs in the last layer's
    weight (rank r: r + 1 of them) adds, on three ranks or more, one SUM all-reduce of each rank's count of that one
    tensor (int64 [W, 1]), once; two ranks are named from the record. The reports name the ranks and counts as
    ever. Then the same with the record read at the next combine, as on CUDA tensors: a report read before then
    names the lowest and highest rank; the next combine fetches the counts and the report names every rank. On 4
    ranks, then, two mesh dimensions (``_two_dimensions``). Rank 0 writes each run's calls per step before the
    assertions on them (traffic.fsdp.<at once>.<world>)."""
    from amp_inspect.distributed import combine as combine_module

    rank = dist.get_rank()
    everywhere = 2  # the step on which every rank holds Infs
    expected = {0: {}, INF_STEP: {1: {"2": 1}}, everywhere: {r: {"2": r + 1} for r in range(world)}, 3: {}}
    record = record_bytes(4, 1)
    fetch = [("all_reduce", 8 * world)] if world >= 3 else []
    layout = [("all_reduce", 16 * world)]  # check_same_layout, once before the first combine
    decide_at_once = getattr(combine_module, "_decide_at_once", None)
    traffic = _Traffic()
    try:
        for at_once in (True, False):
            if not at_once:
                combine_module._decide_at_once = lambda device: False
            model, _ = _fsdp_model(world)
            insp = amp_inspect.attach(model, timeout=TIMEOUT_S)
            finalized: dict[int, object] = {}
            insp.add_listener(lambda r, into=finalized: into.__setitem__(r.step, r.inf_by_rank))
            measured, named, reports = {}, {}, {}
            for step in range(STEPS):
                model(_batch(step).tensor_split(world)[rank]).pow(2).mean().backward()
                if step == everywhere or (step == INF_STEP and rank == 1):
                    model[2].weight.grad.to_local().view(-1)[: rank + 1 if step == everywhere else 1] = float("inf")
                reports[step] = insp.check()
                measured[step] = traffic.take()
                named[step] = (reports[step].ready(), reports[step].inf_by_rank)
                model.zero_grad(set_to_none=True)
            insp.detach()
            if rank == 0:
                (out / f"traffic.fsdp.{int(at_once)}.{world}").write_text(repr(measured))
            for step, (ready, inf_by_rank) in named.items():
                if at_once or step != everywhere or world < 3:
                    assert inf_by_rank == expected[step], (at_once, step, inf_by_rank)
                else:  # read at the next combine: until then the lowest and highest rank
                    assert not ready and inf_by_rank == {0: {"2": 1}, world - 1: {"2": world}}, inf_by_rank
            assert {s: r.inf_by_rank for s, r in reports.items()} == expected == finalized, (at_once, finalized)
            for step, calls in measured.items():
                want = (layout if step == 0 else []) + record
                if at_once:
                    want += fetch if step == everywhere else []
                else:  # fetched at step 3's combine, before its record
                    want = (fetch if step == everywhere + 1 else []) + want
                assert calls == want, (at_once, step, calls, want)
        if world == 4:
            _two_dimensions(traffic, out)
    finally:
        traffic.remove()
        if decide_at_once is not None:
            combine_module._decide_at_once = decide_at_once


def _two_dimensions(traffic: _Traffic, out: Path) -> None:
    """DTensors sharded along both dimensions of a (2, 2) mesh whose rows are not its process groups' rank order
    (mesh [[3, 2], [1, 0]]: each group orders its ranks by global rank): the record, all-reduced over one group
    after the other, names the ranks; the counts of a tensor three ranks hold Infs in come back in the mesh's
    rows (a SUM all-reduce of int64 [4, 1] per group), by global rank. A bias replicated along the second
    dimension (added by the ranks at its coordinate 0 alone) still names both replicas that hold its NaN."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from amp_inspect.distributed.combine import local_shards
    from amp_inspect.gradients.step_report import SHARDS, StepReport

    rank = dist.get_rank()
    mesh = DeviceMesh("cpu", torch.tensor([[3, 2], [1, 0]]))  # rank 3 at (0, 0), 2 at (0, 1), 1 at (1, 0), 0 at (1, 1)
    weight, bias = torch.ones(4, 4), torch.ones(4)  # pieces of an [8, 8] weight, an [8] bias
    if rank != 2:
        weight.view(-1)[: rank + 1] = float("inf")  # ranks 0, 1, 3: 1, 2, 4 Infs
    if rank in (0, 1):  # both replicas of the bias's piece at coordinate 1
        bias[0] = float("nan")
    grads = [
        DTensor.from_local(weight, mesh, [Shard(0), Shard(1)], run_check=False),
        DTensor.from_local(bias, mesh, [Shard(0), Replicate()], run_check=False),
    ]
    local, shards, why = local_shards(grads)
    assert why is None and shards is not None and len(shards.groups) == 2 and shards.ranks == (3, 2, 1, 0), shards
    traffic.take()
    merged = reduce_stats(amp_inspect.tensor_stats(local, formats=("fp16",)), shards, TIMEOUT_S)
    calls = traffic.take()
    if rank == 0:
        (out / "traffic.fsdp.2d.4").write_text(repr(calls))
    assert calls == record_bytes(2, 1) * 2 + [("all_reduce", 8 * 4)] * 2, calls
    assert merged.stats.posinf.tolist() == [7, 0] and merged.stats.nan.tolist() == [0, 1]  # the bias once
    assert merged.nonfinite_by_rank.tolist() == [[4, 0], [0, 0], [2, 1], [1, 1]], merged.nonfinite_by_rank
    report = StepReport(0, merged.stats, ["w", "b"], None)
    report.set_rank_origin(merged.record, ["w", "b"], shards.ranks, kind=SHARDS)
    assert report.inf_by_rank == {0: {"w": 1, "b": 1}, 1: {"w": 2, "b": 1}, 3: {"w": 4}}, report.inf_by_rank


def mesh_2d(world: int, out: Path) -> None:
    """DTensor gradients sharded along both dimensions of a (2, 2) mesh (as FSDP with tensor parallel): the
    statistics stay per rank, but an Inf in rank 3's piece alone still skips the step on every rank, for the
    InspectingGradScaler as for GradScaler (whose DTensor unscale takes the max of found_inf over the mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    for scaler_type in (torch.amp.GradScaler, amp_inspect.InspectingGradScaler):
        weight = nn.Parameter(distribute_tensor(torch.ones(8, 8), mesh, [Shard(0), Shard(1)]))
        grad = distribute_tensor(torch.ones(8, 8), mesh, [Shard(0), Shard(1)])
        if rank == 3:
            grad.to_local()[0, 0] = float("inf")
        weight.grad = grad
        scaler = scaler_type("cpu", init_scale=2.0**4)
        scaler.scale(torch.ones(()))  # the scale tensor exists from the first scale() on
        scaler.step(torch.optim.SGD([weight], lr=0.1))
        scaler.update()
        assert scaler.get_scale() == 2.0**3, (scaler_type.__name__, scaler.get_scale())  # skipped everywhere
        assert torch.equal(weight.to_local(), torch.ones(4, 4)), scaler_type.__name__


def _stats(n: int) -> amp_inspect.core.TensorStats:
    return amp_inspect.tensor_stats([torch.ones(4)] * n)


def mismatch(world: int, out: Path) -> None:
    """Ranks holding different tensors: every rank gets a clear DistributedInspectionError, no hang."""
    n = 2 if dist.get_rank() == 1 else 1
    try:
        Combiner(None, timeout_s=TIMEOUT_S).combine(_stats(n), [(4,)] * n)
    except DistributedInspectionError as error:
        assert "rank 0 has 1 tensors, rank 1 has 2" in str(error), str(error)
    else:
        raise AssertionError("no error for mismatched ranks")


def _fails_within(seconds: float) -> None:
    start = time.monotonic()
    try:
        reduce_stats(_stats(1), timeout_s=3.0)
    except DistributedInspectionError as error:
        elapsed = time.monotonic() - start
        assert elapsed < seconds, f"took {elapsed:.1f} s"
        assert "every rank must call check()" in str(error), str(error)
    else:
        raise AssertionError("no error")


def dead(world: int, out: Path) -> None:
    """A rank that died: the others get a DistributedInspectionError within the timeout."""
    dist.barrier()
    if dist.get_rank() == 1:
        os._exit(0)  # dies without a word
    _fails_within(30.0)


def absent(world: int, out: Path) -> None:
    """A rank that lives but never joins the inspection: the others get an error after the timeout (3 s)."""
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(8.0)
        (out / "absent.1").write_text("OK")
        os._exit(0)
    _fails_within(7.0)


def ddp_sparse(world: int, out: Path) -> None:
    """DDP with a sparse embedding (nn.Embedding(sparse=True)): attach with the comm hook is refused with a clear
    error (the hook cannot count sparse buckets); with ddp_hook=False, a NaN made on rank 1 in the sparse gradient
    reaches every rank's report through DDP's all-reduce, named, and GradScaler's skip agrees."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(16, 4, sparse=True), nn.Linear(4, 1))
    model = nn.parallel.DistributedDataParallel(net)
    try:
        amp_inspect.attach(model)
    except ValueError as error:
        assert "attach with ddp_hook=False" in str(error), error
    else:
        raise AssertionError("attach(ddp_model) with a sparse embedding was not refused")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    insp = amp_inspect.attach(model, scaler, ddp_hook=False, activations="off")
    if dist.get_rank() == 1:
        net[0].weight.register_hook(lambda g: g.coalesce() * float("nan"))
    tokens = torch.tensor([1, 2, 3]) + dist.get_rank()
    scaler.scale(model(tokens).sum()).backward()
    report = insp.check()
    assert report.found_inf and report.offenders == ["0"], (report.found_inf, report.offenders)
    assert report.sparse_modules == ["0"]
    scaler.step(opt)
    found = sum(v.item() for v in scaler._per_optimizer_states[id(opt)]["found_inf_per_device"].values())
    assert found == 1
    scaler.update()
    insp.detach()


ALL = (
    shards,
    shards_cuda,
    ddp,
    ddp_views,
    ddp_more,
    ddp_teardown,
    ddp_cuda,
    ddp_groups,
    fsdp2,
    hsdp,
    mesh_2d,
    mismatch,
    dead,
)
ALL += (absent, ddp_sparse, ddp_traffic, fsdp_traffic)
SCENARIOS = {f.__name__: f for f in ALL}


def _run(rank: int, name: str, world: int, port: int, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    result = "OK"
    try:
        SCENARIOS[name](world, out)
    except BaseException:  # noqa: BLE001 - the test reads it from the file
        result = traceback.format_exc()
    (out / f"{name}.{rank}").write_text(result)
    # Scenarios that leave a broken group (a dead rank) end without the collective teardown.
    if name in ("dead", "absent"):
        os._exit(0)
    dist.barrier()  # no rank tears down while a peer still talks (gloo was seen to abort such a rank)
    dist.destroy_process_group()


def main() -> None:
    name, world, port, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    context = mp.get_context("spawn")
    procs = [context.Process(target=_run, args=(rank, name, world, port, out)) for rank in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()


if __name__ == "__main__":
    main()
