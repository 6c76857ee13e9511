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


def test_shards_on_two_ranks_combine_into_the_whole(tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "result.txt"
    result = subprocess.run(
        [sys.executable, str(script), str(_free_port()), str(WORLD), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert out.read_text() == "OK"


def test_world_of_one_communicates_nothing() -> None:
    stats = amp_inspect.tensor_stats([torch.tensor([1.0, float("nan")]), torch.ones(3)])
    merged = reduce_stats(stats)
    assert merged.stats is stats and merged.ranks_with_inf.tolist() == [True]
