"""reduce_stats across 2 processes (gloo on CPU): shards of the same tensors combine into exactly the
statistics of the whole tensors, and the rank that held Inf is named. The processes run in a subprocess
with a timeout, so a hung collective fails the test instead of hanging the suite."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

import torch

import amp_inspect
from amp_inspect.distributed import reduce_stats

WORLD = 2
SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    import amp_inspect
    from amp_inspect.distributed import reduce_stats

    def tensors():
        g = torch.Generator().manual_seed(0)
        full = [torch.randn(n, generator=g) * 10.0 ** torch.randint(-8, 6, (n,), generator=g) for n in (10, 4097, 33)]
        full[1][3000] = float("inf")  # lands in rank 1's shard
        return full

    def run(rank, port, world, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        try:
            shards = [t.tensor_split(world)[rank] for t in tensors()]
            merged = reduce_stats(amp_inspect.tensor_stats(shards, formats=("fp16", "bf16")))
            if rank == 0:
                whole = amp_inspect.tensor_stats(tensors(), formats=("fp16", "bf16"))
                for name in ("numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow",
                             "amax", "amin_nonzero", "hist"):
                    assert torch.equal(getattr(merged.stats, name), getattr(whole, name)), name
                torch.testing.assert_close(merged.stats.sumsq, whole.sumsq, rtol=1e-6, atol=0)
                assert merged.ranks_with_inf.tolist() == [False, True], merged.ranks_with_inf
                open(out, "w").write("OK")
        finally:
            dist.destroy_process_group()

    if __name__ == "__main__":
        port, world, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        mp.spawn(run, args=(port, world, out), nprocs=world, join=True)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(tmp_path, source: str, out) -> subprocess.CompletedProcess:
    """Runs ``source`` (which spawns WORLD gloo processes) in a subprocess with a timeout: a hung collective
    fails the test instead of hanging the suite."""
    script = tmp_path / "script.py"
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), str(_free_port()), str(WORLD), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_shards_on_two_ranks_combine_into_the_whole(tmp_path) -> None:
    out = tmp_path / "result.txt"
    result = _spawn(tmp_path, SCRIPT, out)
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.read_text() == "OK"


def test_world_of_one_communicates_nothing() -> None:
    stats = amp_inspect.tensor_stats([torch.tensor([1.0, float("nan")]), torch.ones(3)])
    merged = reduce_stats(stats)
    assert merged.stats is stats and merged.ranks_with_inf.tolist() == [True]


FSDP2_SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch import nn

    import amp_inspect

    def run(rank, port, world, out):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=60))
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        insp = amp_inspect.attach(model)
        torch.manual_seed(rank)
        model(torch.randn(4, 8)).pow(2).mean().backward()
        if rank == 1:
            model[2].weight.grad.to_local()[0, 0] = float("inf")  # only in rank 1's shard
        report = insp.check()
        full = [p.grad.full_tensor() for p in model.parameters()]  # collective
        whole = amp_inspect.tensor_stats(full)
        assert report.ranks_with_inf == [1], report.ranks_with_inf
        assert report.offenders == ["2"], report.offenders
        assert report.by_module["0"]["numel"] == 16 * 8 + 16 and report.by_module["2"]["numel"] == 4 * 16 + 4
        assert sum(m["posinf"] for m in report.by_module.values()) == int(whole.posinf.sum()) == 1
        assert sum(m["zero"] for m in report.by_module.values()) == int(whole.zero.sum())
        open(f"{out}.{rank}", "w").write("OK")
        dist.destroy_process_group()

    if __name__ == "__main__":
        port, world, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
        mp.spawn(run, args=(port, world, out), nprocs=world, join=True)
    """
)


def test_fsdp2_shards_give_whole_parameter_statistics_and_name_the_rank(tmp_path) -> None:
    result = _spawn(tmp_path, FSDP2_SCRIPT, tmp_path / "ok")
    done = [(tmp_path / f"ok.{rank}").exists() for rank in range(WORLD)]
    assert all(done), result.stdout + result.stderr
    # Both ranks checked everything. A non-zero exit after that can only come from process teardown, which
    # gloo with FSDP2 on CPU was seen to abort once here; the assertions above ran before it.
    assert result.returncode == 0 or "AssertionError" not in result.stderr, result.stderr
