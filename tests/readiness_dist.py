"""A distributed readiness scenario for tests/test_readiness_hooks.py: run as
``python -m tests.readiness_dist NAME WORLD PORT OUT`` (tests/dist_scenarios.py's runner, its own scenarios)."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import amp_inspect
from amp_inspect.core.format_readiness import format_readiness
from amp_inspect.core.recipes import RECIPE_NAMES
from amp_inspect.readiness import hooks as readiness_hooks
from amp_inspect.readiness.report import OperandStats
from tests import dist_scenarios


def _operand(t: torch.Tensor) -> OperandStats:
    r = readiness_hooks._rows(format_readiness([t]))[0]
    return OperandStats.from_row(r.counts.tolist(), r.sums.tolist(), float(r.amax), len(RECIPE_NAMES))


def ddp_readiness(world: int, out: Path) -> None:
    """DDP, each rank its own batch: the readiness table is every rank's X merged (counts add, amax the max), the
    same table on every rank, and W and dW (the same on every rank) counted once: those of one process."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    wrapped = nn.parallel.DistributedDataParallel(model)
    insp = amp_inspect.attach(wrapped, readiness_every=1, timeout=30.0)
    batches = [torch.randn(4 + r, 16, generator=torch.Generator().manual_seed(r)) * (r + 1) for r in range(world)]
    wrapped(batches[rank]).square().mean().backward()
    report = insp.check()
    x = report.readiness.modules["0"]["X"]
    want = _operand(batches[0])
    for b in batches[1:]:
        want = want.merged(_operand(b))
    assert (x.numel, x.nonzero, x.flushed, x.saturated, x.blocks) == (
        want.numel,
        want.nonzero,
        want.flushed,
        want.saturated,
        want.blocks,
    ), (x, want)
    assert x.amax == want.amax
    for operand, tensor in (("W", model[0].weight), ("dW", model[0].weight.grad)):
        got, alone = report.readiness.modules["0"][operand], _operand(tensor.detach())
        assert (got.numel, got.flushed, got.saturated, got.amax) == (
            alone.numel,
            alone.flushed,
            alone.saturated,
            alone.amax,
        )
        assert got.sq_error == alone.sq_error, operand  # was world times the weight's own: counted once per rank
    mine = torch.tensor([x.sq_error[0], float(report.readiness.modules["2"]["dY"].flushed[6])], dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    assert all(torch.equal(e, everyone[0]) for e in everyone), everyone  # one table on every rank
    insp.detach()


def tp_readiness(world: int, out: Path) -> None:
    """Tensor parallel (parallelize_module, colwise then rowwise): W and dW are DTensors, X of the colwise layer
    is made one by its input hook. Each rank measures its local pieces: the shards of W add up to the whole
    weight, and the replicated X counts once (tensor-parallel coordinate 0 adds it); nothing raises in the forward."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    mesh = init_device_mesh("cpu", (world,))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    insp = amp_inspect.attach(model, readiness_every=1, timeout=30.0)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the DTensor gradients' partial statistics are said apart
        model(x).square().mean().backward()
        report = insp.check()
    table = report.readiness.modules
    assert set(table) == {"0", "2"}
    assert {op: table["0"][op].numel for op in ("X", "W", "dY", "dW")} == {
        "X": 4 * 16,
        "W": 16 * 32,
        "dY": 4 * 32,
        "dW": 16 * 32,
    }
    assert table["2"]["W"].numel == 32 * 8 and table["2"]["dW"].numel == 32 * 8
    assert table["0"]["X"].amax == float(x.abs().max())
    insp.detach()


def readiness_fails_on_one_rank(world: int, out: Path) -> None:
    """One rank's measurement of the first layer's X and W raises (as an out-of-memory would): that rank warns,
    its pieces add zero rows, and the ranks still hold the same rows, so the merge neither raises nor shifts the
    later rows: the table is the other ranks' X of that layer and every rank's rows elsewhere."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))
    wrapped = nn.parallel.DistributedDataParallel(model)
    insp = amp_inspect.attach(wrapped, readiness_every=1, timeout=30.0)
    batches = [torch.randn(4, 16, generator=torch.Generator().manual_seed(r)) for r in range(world)]
    real = readiness_hooks.format_readiness
    calls = []

    def failing_first_call(tensors, recipes=None):
        calls.append(len(tensors))
        if rank == 1 and len(calls) == 1:
            raise RuntimeError("planted failure")
        return real(tensors, recipes)

    readiness_hooks.format_readiness = failing_first_call
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped(batches[rank]).square().mean().backward()
            report = insp.check()
    finally:
        readiness_hooks.format_readiness = real
    said = [str(w.message) for w in caught if "could not measure" in str(w.message)]
    assert (len(said) == 1) == (rank == 1), said
    table = report.readiness.modules
    assert table["0"]["X"].numel == 16 * 4 * (world - 1)  # rank 1's X added nothing
    assert table["2"]["X"].numel == 32 * 4 * world  # the rows after it are not shifted
    assert table["0"]["W"].numel == 16 * 32  # W: measured by rank 0 alone, as without the failure
    assert table["2"]["dY"].numel == 8 * 4 * world
    insp.detach()


dist_scenarios.SCENARIOS = {
    "ddp_readiness": ddp_readiness,
    "tp_readiness": tp_readiness,
    "readiness_fails_on_one_rank": readiness_fails_on_one_rank,
}  # the runner reads its module's table

if __name__ == "__main__":
    sys.argv[0] = __file__
    dist_scenarios.main()
