"""A distributed update_every scenario for tests/test_optimizer_watch.py: run as
``python -m tests.update_dist NAME WORLD PORT OUT`` (tests/dist_scenarios.py's runner, its own scenarios)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

import amp_inspect
from tests import dist_scenarios


def fsdp2_update(world: int, out: Path) -> None:
    """FSDP2 over the world, every rank the same batch: each rank measures its shards and the counts add up to the
    unsharded model's, stepped alike, on every rank."""
    model, reference = dist_scenarios._fsdp_model(world)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-7)
    ref_opt = torch.optim.AdamW(reference.parameters(), lr=1e-7)
    insp = amp_inspect.attach(model, optimizer=opt, update_every=1, timeout=30.0)
    batch = dist_scenarios._batch(0)
    model(batch).square().mean().backward()
    reference(batch).square().mean().backward()
    insp.check()
    before = {n: p.detach().clone() for n, p in reference.named_parameters()}
    grads = {n: p.grad.detach().clone() for n, p in reference.named_parameters()}
    opt.step()
    ref_opt.step()
    got = insp.history[-1].update.by_module
    for module in ("0", "2"):
        with_grad = lost = numel = 0
        for kind in ("weight", "bias"):
            name = f"{module}.{kind}"
            has = torch.isfinite(grads[name]) & (grads[name] != 0)
            after = dict(reference.named_parameters())[name].detach()
            numel += after.numel()
            with_grad += int(has.sum())
            lost += int((has & (after == before[name])).sum())
        m = got[module]
        assert (m["numel"], m["numel_with_grad"], m["lost"]) == (numel, with_grad, lost), (module, m, numel, lost)
    assert dist.get_world_size() == world
    insp.detach()


dist_scenarios.SCENARIOS = {"fsdp2_update": fsdp2_update}  # the runner reads its module's table

if __name__ == "__main__":
    sys.argv[0] = __file__
    dist_scenarios.main()
