"""Statistics combined across ranks: the building block of the distributed Inspector (issue 5, in progress).

``reduce_stats(stats, group)`` merges the TensorStats of the same T tensors (or the shards of the same T
tensors) held by every rank of a process group into global statistics: counts and histograms summed, amax
max, amin_nonzero min, sumsq summed. It also says which ranks held NaN/Inf. That is exact for disjoint
pieces of each tensor (FSDP2 shards, or each rank's local gradients before DDP's all-reduce); replicated
gradients (after DDP's all-reduce) would be counted once per rank.

Cost: three all-reduces issued together (SUM of one packed float64 buffer: counts, histograms, sums of
squares and the per-rank NaN/Inf flags, exact below 2^53; MAX of amax; MIN of amin_nonzero), asynchronous
where the backend allows; with a world of one, nothing is communicated.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .stats import TensorStats, stats_outputs


def local_shards(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], dist.ProcessGroup | None, str | None]:
    """The tensors to inspect on this rank: a DTensor gradient (FSDP2, tensor parallel) is replaced by its
    local shard. Returns (tensors, group to combine over, why not) where group is set when every DTensor is
    sharded over one 1-D mesh (then the shards are disjoint and reduce_stats makes whole-parameter
    statistics); with replicated placements or several meshes it is None and the reason says why."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return grads, None, None
    local, meshes, replicated = [], set(), False
    for g in grads:
        if isinstance(g, DTensor):
            local.append(g.to_local())
            meshes.add(g.device_mesh)
            replicated = replicated or not all(p.is_shard() for p in g.placements)
        else:
            local.append(g)
    if not meshes:
        return local, None, None
    if replicated:
        return local, None, "some DTensor gradients are replicated: statistics are of this rank's local pieces"
    if len(meshes) > 1 or next(iter(meshes)).ndim != 1:
        return local, None, "DTensor gradients on several or multi-dimensional meshes: statistics are local"
    if len(local) != sum(isinstance(g, DTensor) for g in grads):
        return local, None, "a mix of DTensor and plain gradients: statistics are of this rank's local pieces"
    return local, next(iter(meshes)).get_group(), None


@dataclass(frozen=True)
class GlobalStats:
    stats: TensorStats  # statistics over every rank's pieces
    ranks_with_inf: torch.Tensor  # bool [world]: which ranks held NaN/Inf in their pieces


def reduce_stats(stats: TensorStats, group: dist.ProcessGroup | None = None) -> GlobalStats:
    """Combines every rank's statistics of the same T tensors (see the module docstring). Collective: every
    rank of ``group`` must call it with statistics of the same shape, in the same order."""
    counts, hist, amax, amin, sumsq = stats_outputs(stats)
    device = counts.device
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        flags = (stats.nonfinite.sum() > 0).reshape(1)
        return GlobalStats(stats, flags)
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    # One SUM buffer: counts and histograms as float64 (exact below 2^53), the sums of squares, and a
    # one-hot column of this rank's NaN/Inf flag.
    flags = torch.zeros(world, dtype=torch.float64, device=device)
    flags[rank] = (stats.nonfinite.sum() > 0).to(torch.float64)
    packed = torch.cat([counts.double().flatten(), hist.double().flatten(), sumsq.double(), flags])
    extremes_max = amax.clone()
    extremes_min = amin.clone()
    work = [
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group, async_op=True),
        dist.all_reduce(extremes_max, op=dist.ReduceOp.MAX, group=group, async_op=True),
        dist.all_reduce(extremes_min, op=dist.ReduceOp.MIN, group=group, async_op=True),
    ]
    for w in work:
        w.wait()
    n_counts, n_hist, n_rows = counts.numel(), hist.numel(), sumsq.numel()
    merged_counts = packed[:n_counts].round().to(torch.int64).reshape(counts.shape)
    merged_hist = packed[n_counts : n_counts + n_hist].round().to(torch.int64).reshape(hist.shape)
    merged_sumsq = packed[n_counts + n_hist : n_counts + n_hist + n_rows]
    ranks_with_inf = packed[n_counts + n_hist + n_rows :] > 0
    outputs = (merged_counts, merged_hist, extremes_max, extremes_min, merged_sumsq)
    return GlobalStats(TensorStats.from_op_outputs(outputs, stats.formats), ranks_with_inf)
