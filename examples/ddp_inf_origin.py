"""DDP with amp_inspect: a NaN made on one rank is traced to that rank and module on every rank.

Runs on CPUs (gloo) or one GPU per rank (NCCL):

    torchrun --standalone --nproc_per_node=2 examples/ddp_inf_origin.py

On step 3, rank 1 (only) multiplies one layer's output by inf. After DDP's all-reduce every rank's gradients
hold the resulting NaN/Inf, GradScaler skips the step everywhere, and the report says where it came from.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

import amp_inspect

BAD_STEP, BAD_RANK = 3, 1


def main() -> None:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)).to(device)
    step_now = [0]

    def poison(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        return output * float("inf") if (step_now[0] == BAD_STEP and rank == BAD_RANK) else output

    model[2].register_forward_hook(poison)  # the layer whose gradients go bad, on one rank only
    ddp = nn.parallel.DistributedDataParallel(model)
    scaler = torch.amp.GradScaler(device.type)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    insp = amp_inspect.attach(ddp, scaler)  # registers amp_inspect.ddp_comm_hook
    if rank == 0:  # called once a report's values are on the host: no sync
        insp.add_listener(lambda r: r.found_inf and print(f"step {r.step}: skipped; NaN/Inf from {r.inf_by_rank}"))
    dtype = torch.float16 if cuda else torch.bfloat16
    for step_now[0] in range(6):
        x = torch.randn(16, 32, device=device, generator=torch.Generator(device).manual_seed(100 * step_now[0] + rank))
        with torch.autocast(device.type, dtype=dtype):
            loss = ddp(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        insp.check()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    insp.detach()  # outstanding reports reach the listener; the hook only averages from now on
    if rank == 0:
        print(insp.summary())
    # Every rank reaches the end before any tears its process group down: gloo was seen to abort a rank
    # whose peer had already gone (about 1 run in 8 here, also without amp_inspect).
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
