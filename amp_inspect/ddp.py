"""DDP: find the rank and module that produced a NaN/Inf, before the all-reduce spreads it to every rank.

After DDP's all-reduce every rank holds the same averaged gradients, so a NaN made on rank 3 is on all ranks
and a check there cannot say where it came from. ``ddp_comm_hook`` runs where DDP hands each gradient bucket
to the network: it counts NaN/Inf in this rank's own gradients of the bucket (the fused op over the bucket's
views, one pass), then averages exactly as DDP without a hook does (multiply by 1/world, all-reduce SUM), so
training is bitwise the same. After the last bucket, one more all-reduce (int64 [world, parameters], issued
asynchronously) tells every rank each rank's counts; the next report takes them as ``inf_by_rank``.

The report's other statistics stay those of the averaged gradients (what GradScaler and the optimizer see,
identical on every rank): its total_norm is the one to clip with.

    insp = amp_inspect.attach(ddp_model, scaler)   # registers the hook (ddp_hook=False to opt out)
    # or, by hand, before the first backward:
    ddp_model.register_comm_hook(insp, amp_inspect.ddp_comm_hook)

Cost per step: one read of the gradients inside backward (the fused op, per bucket) and
8 * world * parameters bytes all-reduced. No module here imports this hook's state on a world of one.
"""

# No ``from __future__ import annotations``: DDP compares the hook's annotations with real types.

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from .distributed import DEFAULT_TIMEOUT_S, global_ranks, wait_all
from .naming import ParamEntry
from .stats import tensor_stats

if TYPE_CHECKING:
    from .inspector import Inspector

# The hook only needs NaN/Inf counts, which every format's statistics include; one format keeps it lean.
_HOOK_FORMATS = ("fp16",)


class BeforeAllReduce:
    """Per-rank NaN/Inf counts of each parameter's local gradient, gathered by ``ddp_comm_hook``."""

    def __init__(
        self, entries: list[ParamEntry], group: dist.ProcessGroup | None, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.group = group
        self.timeout_s = timeout_s
        self.ranks = global_ranks(group)  # the global rank of each row of the counts
        self.modules = [e.module for e in entries]  # the column names of the counts
        self._column_of_param = {id(e.param): i for i, e in enumerate(entries)}
        self._columns: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}  # bucket index -> (param ids, index)
        self._counts: torch.Tensor | None = None  # this rank's counts, filled bucket by bucket
        self._pending: tuple[dist.Work, torch.Tensor] | None = None  # the last step's exchange
        self.detached = False

    def _bucket_columns(self, bucket: dist.GradBucket, device: torch.device) -> torch.Tensor:
        # DDP rebuilds its buckets after the first iteration: the cache is keyed by the parameters too.
        ids = tuple(id(p) for p in bucket.parameters())
        cached = self._columns.get(bucket.index())
        if cached is None or cached[0] != ids:
            unknown = [i for i in ids if i not in self._column_of_param]
            if unknown:
                raise RuntimeError(
                    "amp_inspect.ddp_comm_hook: DDP reduces parameters this inspector does not know; register the "
                    "hook with the inspector attached to the same DDP model"
                )
            index = torch.tensor([self._column_of_param[i] for i in ids], dtype=torch.int64, device=device)
            cached = self._columns[bucket.index()] = (ids, index)
        return cached[1]

    def bucket_ready(self, bucket: dist.GradBucket) -> None:
        """Counts NaN/Inf in this rank's gradients of ``bucket``; after the last bucket, starts the exchange."""
        grads = bucket.gradients()
        if grads:
            device = grads[0].device
            if self._counts is None:
                self._counts = torch.zeros(len(self.modules), dtype=torch.int64, device=device)
            with torch.no_grad():
                stats = tensor_stats(grads, formats=_HOOK_FORMATS)
                self._counts.index_copy_(0, self._bucket_columns(bucket, device), stats.nonfinite)
        if bucket.is_last() and self._counts is not None:
            self._finish_step(self._counts)
            self._counts = None

    def _finish_step(self, counts: torch.Tensor) -> None:
        self.take()  # a step nobody reported on: its exchange is complete, drop it
        world, rank = dist.get_world_size(self.group), dist.get_rank(self.group)
        table = torch.zeros(world, counts.numel(), dtype=torch.int64, device=counts.device)
        table[rank] = counts
        self._pending = (dist.all_reduce(table, group=self.group, async_op=True), table)

    def take(self) -> torch.Tensor | None:
        """The last step's counts of every rank, int64 [world, parameters] (None when no step was exchanged
        since the last take). Waits for the exchange, at most the timeout."""
        if self._pending is None:
            return None
        work, table = self._pending
        self._pending = None
        what = "exchanging the NaN/Inf counts before the all-reduce"
        wait_all([work], self.timeout_s, what, self.group, table.device)
        return table


def ddp_comm_hook(state: "Inspector", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook (``ddp_model.register_comm_hook(insp, amp_inspect.ddp_comm_hook)``): inspects
    this rank's gradients of the bucket for NaN/Inf, then averages them as DDP's built-in reduction does."""
    origin = state._before_allreduce_for(bucket)
    if not origin.detached:  # after insp.detach() (on every rank) the hook only averages
        origin.bucket_ready(bucket)
    group = origin.group if origin.group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    # What DDP does without a hook: multiply by 1/world (a double scalar) and all-reduce SUM. torch's own
    # allreduce_hook divides by world instead, which rounds differently when world is not a power of two.
    buffer.mul_(1.0 / dist.get_world_size(group))
    return dist.all_reduce(buffer, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def ddp_of(model: nn.Module) -> nn.parallel.DistributedDataParallel | None:
    """The DDP wrapper at the root of ``model``, if any (torch.compile's wrapper looked through)."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, nn.parallel.DistributedDataParallel) else None
