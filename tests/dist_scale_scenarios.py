"""Multi-process scenarios of InspectingGradScaler(policy="headroom") for tests/test_scale_policy.py, run as
``python -m tests.dist_scale_scenarios NAME WORLD PORT OUT_DIR`` (the runner of tests/dist_scenarios.py, with
these scenarios added): every rank must reach the same scale decision, from statistics combined over ranks."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import amp_inspect
from tests import dist_scenarios, models
from tests.dist_scenarios import TIMEOUT_S, _fsdp_model, _inject_inf

STEPS = 5
BAD_STEP = 1  # dist_scenarios.INF_STEP: the step on which rank 1 alone makes an Inf


def _same_on_every_rank(value: object, what: str) -> None:
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    assert all(v == gathered[0] for v in gathered), f"{what} differs across ranks: {gathered}"


def ddp_headroom(world: int, out: Path) -> None:
    """DDP with the comm hook; each rank its own batch, rank 1 alone makes an Inf on BAD_STEP: every rank
    decides the same scale, for the same reason, and the weights stay identical."""
    rank = dist.get_rank()
    step = [0]
    model = models.gpt()
    _inject_inf(model.ln_f.weight, lambda: step[0])
    wrapped = nn.parallel.DistributedDataParallel(model)
    scaler = amp_inspect.InspectingGradScaler("cpu", policy="headroom")
    insp = amp_inspect.attach(wrapped, scaler, timeout=TIMEOUT_S)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step[0] in range(STEPS):
        inputs, targets = models.batch_for(model, step[0] * world + rank)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = wrapped(inputs)
        loss = nn.functional.cross_entropy(logits.float().flatten(0, -2), targets.flatten())
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        decision = scaler.last_decision
        assert decision is not None
        _same_on_every_rank(decision.to_record(), f"step {step[0]}'s decision")
        assert (decision.skip is not None) == (step[0] == BAD_STEP), decision
    _same_on_every_rank([p.detach().tolist() for p in model.parameters()], "the weights")
    insp.detach()


def fsdp2_headroom(world: int, out: Path) -> None:
    """FSDP2: each rank holds a shard, the statistics are combined; an Inf in rank 1's shard alone skips the step
    on every rank and every rank decides the same scale."""
    rank = dist.get_rank()
    model, _ = _fsdp_model(world)
    scaler = amp_inspect.InspectingGradScaler("cpu", policy="headroom")
    insp = amp_inspect.attach(model, scaler, timeout=TIMEOUT_S)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x = dist_scenarios._batch(step).tensor_split(world)[rank]
        scaler.scale(model(x).pow(2).mean()).backward()
        if step == BAD_STEP and rank == 1:
            model[2].weight.grad.to_local()[0, 0] = float("inf")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        decision = scaler.last_decision
        _same_on_every_rank(decision.to_record(), f"step {step}'s decision")
        assert (decision.skip is not None) == (step == BAD_STEP), decision
    insp.detach()


def mesh_2d_headroom(world: int, out: Path) -> None:
    """DTensor gradients sharded along both dimensions of a (2, 2) mesh: the statistics stay per rank, and each
    rank's piece has another magnitude (rank r: 8^r). The decision must come from the largest of them on every
    rank (a per-rank decision would give four scales)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    rank = dist.get_rank()
    weight = nn.Parameter(distribute_tensor(torch.ones(8, 8), mesh, [Shard(0), Shard(1)]))
    grad = distribute_tensor(torch.ones(8, 8), mesh, [Shard(0), Shard(1)])
    grad.to_local().mul_(8.0**rank)
    weight.grad = grad
    scaler = amp_inspect.InspectingGradScaler("cpu", policy="headroom")
    scaler.scale(torch.ones(()))
    scaler.step(torch.optim.SGD([weight], lr=0.0))
    scaler.update()
    _same_on_every_rank(scaler.get_scale(), "the scale")
    # The largest gradient, 8^3 = 2^9 at scale 1, has 6 binades of room under 65520; margin 2 leaves 4.
    assert scaler.get_scale() == 2.0**4, scaler.get_scale()


SCENARIOS = {f.__name__: f for f in (ddp_headroom, fsdp2_headroom, mesh_2d_headroom)}
dist_scenarios.SCENARIOS.update(SCENARIOS)  # the spawned ranks import this module as their __main__ too

if __name__ == "__main__":
    dist_scenarios.main()
