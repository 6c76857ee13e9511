"""A distributed readiness scenario for tests/test_readiness_hooks.py: run as
``python -m tests.readiness_dist NAME WORLD PORT OUT`` (tests/dist_scenarios.py's runner, its own scenarios)."""

from __future__ import annotations

import sys
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
    same table on every rank, and W counted once per rank."""
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
    assert report.readiness.modules["0"]["W"].numel == world * 16 * 32
    mine = torch.tensor([x.sq_error[0], float(report.readiness.modules["2"]["dY"].flushed[6])], dtype=torch.float64)
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    assert all(torch.equal(e, everyone[0]) for e in everyone), everyone  # one table on every rank
    insp.detach()


dist_scenarios.SCENARIOS = {"ddp_readiness": ddp_readiness}  # the runner reads its module's table

if __name__ == "__main__":
    sys.argv[0] = __file__
    dist_scenarios.main()
