"""Equality across layouts (DDP, tensor parallel, FSDP2 x TP, HSDP x TP) for tests/test_distributed.py (issue 32):
run as ``python -m tests.tp_dist NAME WORLD PORT OUT`` (tests/dist_scenarios.py's runner, its own scenarios).

Each builds the same model and batch unsharded in every process and sharded across the processes, steps both, and
holds the sharded run's gradient and update statistics equal to the unsharded one's: counts exactly, extremes
exactly, norms to float rounding (the sharded run sums in another order)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import amp_inspect
from tests import dist_scenarios

EXACT = ("numel", "numel_with_grad", "lost", "made_nonfinite", "state_underflow", "exact_zero_update")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _tensor_parallel(model: nn.Module, mesh) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    # Colwise: weight and bias Shard(0); rowwise: weight Shard(1), bias Replicate (counted once, by tp rank 0).
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})


def _same_updates(got: dict, want: dict) -> None:
    assert set(got) == set(want), (set(got), set(want))
    for module, expected in want.items():
        for key, value in expected.items():
            if key in EXACT:
                assert got[module][key] == value, (module, key, got[module][key], value)


def _run(model: nn.Module, reference: nn.Module, batch: torch.Tensor, whole_batch: torch.Tensor) -> None:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-3)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1, timeout=dist_scenarios.TIMEOUT_S)
    ref = amp_inspect.attach(reference, optimizer=ref_opt, update_every=1)
    for _step in range(2):  # the second step: Adam's state exists
        model(batch).square().mean().backward()
        reference(whole_batch).square().mean().backward()
        report, want = insp.check(), ref.check()
        assert report.inf_by_rank == {}, (report.inf_by_rank, {m: v["nan"] for m, v in report.by_module.items()})
        dist_scenarios._assert_same_modules(report, want)
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    insp.check()  # the last measured update reaches the history with the next step
    ref.check()
    _same_updates(insp.history[1].update.by_module, ref.history[1].update.by_module)
    insp.detach()
    ref.detach()


def tp(world: int, out: Path) -> None:
    """Tensor parallel over the world (1-D mesh), every rank the whole batch; then an Inf in tp rank 1's shard of
    the rowwise weight is named by its rank."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    model = _model()
    reference = copy.deepcopy(model)
    _tensor_parallel(model, mesh)
    batch = dist_scenarios._batch(0)
    _run(model, reference, batch, batch)
    insp = amp_inspect.attach(model, timeout=dist_scenarios.TIMEOUT_S)
    model(batch).square().mean().backward()
    if dist.get_rank() == 1:
        model[2].weight.grad.to_local()[0, 0] = float("inf")
    report = insp.check()
    assert report.found_inf and report.inf_by_rank == {1: {"2": 1}}, report.inf_by_rank
    insp.detach()


def tp_traffic(world: int, out: Path) -> None:
    """Tensor parallel's combine, bytes per step (one group, as FSDP2's: dist_scenarios.record_bytes, 4 tensors, 1
    format) on a healthy step and on one where rank 1 alone holds an Inf in the rowwise weight and in the rowwise
    bias (replicated: added by tp rank 0 alone, yet named for rank 1, which held it). Rank 0 writes the calls per
    step (traffic.tp.<world>) before the assertions on them."""
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    model = _model()
    _tensor_parallel(model, init_device_mesh("cpu", (world,)))
    insp = amp_inspect.attach(model, timeout=dist_scenarios.TIMEOUT_S)
    traffic = dist_scenarios._Traffic()
    measured, named = {}, {}
    try:
        for step in range(2):
            model(dist_scenarios._batch(0)).square().mean().backward()
            if step == 1 and rank == 1:
                model[2].weight.grad.to_local()[0, 0] = float("inf")
                model[2].bias.grad.to_local()[0] = float("inf")
            named[step] = insp.check().inf_by_rank
            measured[step] = traffic.take()
            model.zero_grad(set_to_none=True)
    finally:
        traffic.remove()
    insp.detach()
    if rank == 0:
        (out / f"traffic.tp.{world}").write_text(repr(measured))
    assert named == {0: {}, 1: {1: {"2": 2}}}, named
    record = dist_scenarios.record_bytes(4, 1)
    assert measured == {0: [("all_reduce", 16 * world), *record], 1: record}, measured


def fsdp_tp(world: int, out: Path) -> None:
    """FSDP2 x tensor parallel on a (2, world / 2) mesh: the batch split over the data-parallel dimension."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    model = _model()
    reference = copy.deepcopy(model)
    _tensor_parallel(model, mesh["tp"])
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    whole = dist_scenarios._batch(0)
    dp = mesh.get_coordinate()[0]
    _run(model, reference, whole.tensor_split(2)[dp], whole)
    # An Inf in the last rank's piece of the rowwise weight (sharded along both dimensions): named by its rank.
    insp = amp_inspect.attach(model, timeout=dist_scenarios.TIMEOUT_S)
    model(whole.tensor_split(2)[dp]).square().mean().backward()
    rank = dist.get_rank()
    if rank == world - 1:
        model[2].weight.grad.to_local()[0, 0] = float("inf")
    report = insp.check()
    assert report.found_inf and report.inf_by_rank == {world - 1: {"2": 1}}, report.inf_by_rank
    assert report.by_module["2"]["posinf"] == 1
    insp.detach()


def hsdp_tp(world: int, out: Path) -> None:
    """HSDP x tensor parallel on a (2, 2, 2) mesh (replicate, shard, tp): combined over shard and tp, the replicas
    left alone; the batch split over the four data-parallel ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2, world // 4), mesh_dim_names=("replicate", "shard", "tp"))
    model = _model()
    reference = copy.deepcopy(model)
    _tensor_parallel(model, mesh["tp"])
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh["replicate", "shard"])
    fully_shard(model, mesh=mesh["replicate", "shard"])
    whole = dist_scenarios._batch(0)
    coordinate = mesh.get_coordinate()
    _run(model, reference, whole.tensor_split(4)[2 * coordinate[0] + coordinate[1]], whole)


def ddp(world: int, out: Path) -> None:
    """DDP, the batch split over the ranks: the averaged gradients' statistics and the update statistics are the
    unsharded model's on the whole batch (every rank holds the same; nothing is combined)."""
    model = _model()
    reference = copy.deepcopy(model)
    wrapped = nn.parallel.DistributedDataParallel(model)
    whole = dist_scenarios._batch(0)
    _run(wrapped, reference, whole.tensor_split(world)[dist.get_rank()], whole)


# The runner reads its module's table.
dist_scenarios.SCENARIOS = {"tp": tp, "fsdp_tp": fsdp_tp, "hsdp_tp": hsdp_tp, "ddp": ddp, "tp_traffic": tp_traffic}

if __name__ == "__main__":
    sys.argv[0] = __file__
    dist_scenarios.main()
