"""The per-step record of where NaN/Inf were across ranks: a fixed size per tensor, whatever the world.

Used by the DDP hook (distributed/ddp.py: each rank's parameter gradients before the all-reduce; ranks: the
group's ranks) and by ``reduce_stats`` (distributed/combine.py: each rank's shards under FSDP2, HSDP, tensor
parallel; ranks: the rows of ``ShardGroups.ranks``, row-major over its groups).

Each rank puts its own NaN/Inf count of each of the T tensors into two all-reduces (issued together,
asynchronously): SUM of the counts (int64 [T]; reduce_stats sums them in its float64 SUM buffer, exact below
2^53) and MAX of two keys per tensor (int64 [2, T]), each key a rank and that rank's count in one integer,
``key = position << shift | count`` (0 where the rank has none):

- the *high* key, position ``rank + 1``: its maximum holds the highest rank with NaN/Inf and its count;
- the *low* key, position ``world - rank``: its maximum holds the lowest rank with NaN/Inf and its count.

Sums and maxima compose: all-reduced over several groups one after the other (ShardGroups' mesh dimensions),
they hold the same record as one all-reduce over all of their ranks.

That names every rank exactly when at most two ranks hold NaN/Inf in a tensor: one (the low and the high
key name the same rank, whose count is the sum) or two (their counts add up to the sum; a third rank would add
at least one). Only a tensor that three or more ranks hold NaN/Inf in (or two with a count too large for its
key) needs each rank's count: then, and only then, each rank's counts of those K tensors are fetched, once for
the step, by the owner's ``Fetch``: DDP's is one all-gather (``Gathered``: 8 * K bytes per rank);
reduce_stats' a SUM all-reduce of a [world, K] block per group (combine.py). Bytes per step of the record:
24 * T.

``shift`` leaves the position bits for ``world``: 63 - world.bit_length() bits of count (48 at 16,384 ranks,
counts below 2.8e14 per tensor; a larger count saturates and the tensor's counts are fetched).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist

from amp_inspect.core.host_copy import HostCopy


def key_shift(world: int) -> int:
    """Bits of count in a key: the position (1..world) takes the bits above them, within int64's 63."""
    return 63 - world.bit_length()


def rank_keys(counts: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's int64 [2, T] keys (high, low) of its NaN/Inf ``counts`` (int64 [T]), for one MAX all-reduce."""
    shift = key_shift(world)
    held = counts > 0
    count = counts.clamp(max=(1 << shift) - 1)
    high = torch.where(held, count | ((rank + 1) << shift), 0)
    low = torch.where(held, count | ((world - rank) << shift), 0)
    return torch.stack([high, low])


def ranks_from_keys(totals: np.ndarray, keys: np.ndarray, world: int) -> tuple[list[tuple[int, int, int]], list[int]]:
    """Decodes a completed record: ([(rank, column, count)] of every tensor at most two ranks hold NaN/Inf in,
    [columns that need each rank's count]). ``totals`` int64 [T], ``keys`` int64 [2, T] (high, low)."""
    shift = key_shift(world)
    mask = (1 << shift) - 1
    named: list[tuple[int, int, int]] = []
    unnamed: list[int] = []
    for column in np.flatnonzero(totals):
        total, high, low = int(totals[column]), int(keys[0, column]), int(keys[1, column])
        high_rank, high_count = (high >> shift) - 1, high & mask
        low_rank, low_count = world - (low >> shift), low & mask
        if high_rank == low_rank:
            named.append((low_rank, int(column), total))
        elif low_count < mask and high_count < mask and low_count + high_count == total:
            named += [(low_rank, int(column), low_count), (high_rank, int(column), high_count)]
        else:
            unnamed.append(int(column))
    return named, unnamed


class PerRank(Protocol):
    """Each rank's counts of the K tensors a record cannot name alone, on their way to the host."""

    def ready(self) -> bool:
        """Whether ``table()`` can be read without waiting (never waits)."""
        ...

    def table(self) -> np.ndarray:
        """int64 [world, K]: row r is the rank at position r's counts (waits on first use)."""
        ...


# Starts fetching each rank's counts of K tensors from this rank's own (int64 [K]); collective: every rank of the
# record calls it at the same point, with the same K.
Fetch = Callable[[torch.Tensor], PerRank]


class Gathered:
    """Each rank's counts by one all-gather over ``group`` (the DDP hook's Fetch): rows in the group's rank
    order, which are the record's positions there. ``wait`` waits for a collective of the group
    (combine.wait_all, with the owner's timeout)."""

    def __init__(
        self,
        mine: torch.Tensor,
        group: dist.ProcessGroup | None,
        wait: Callable[[list[dist.Work], torch.device], None],
    ) -> None:
        self._pieces = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
        self._work = dist.all_gather(self._pieces, mine, group=group, async_op=True)
        self._wait = wait
        self._table: np.ndarray | None = None

    def ready(self) -> bool:
        return self._table is not None or self._work.is_completed()

    def table(self) -> np.ndarray:
        if self._table is None:
            self._wait([self._work], self._pieces[0].device)
            self._table = torch.stack(self._pieces).cpu().numpy()
        return self._table


class RankRecord:
    """One step's record (see the module docstring), on its way to the host: what a report reads as the NaN/Inf
    count of each rank (rows: the positions) and tensor, through ``nonzero()`` (a report's ``RankCounts``).
    ``shape`` is (world, T), the table it stands for (never made).

    ``decide()`` reads the record on the host and, when some tensor needs each rank's count, starts ``fetch``
    of ``own`` (this rank's counts). It is collective: the owner calls it at the same point on every rank
    (every rank reads the same record, so all decide alike). On host tensors the owner calls it at once; on
    CUDA tensors at a later collective point (the DDP hook: its next synchronised backward; reduce_stats' Combiner:
    its next combine), when the copy has long arrived (reading it at once would be a host sync). A report read
    before then names, for such a tensor, its lowest and highest rank only."""

    def __init__(self, totals: torch.Tensor, keys: torch.Tensor, own: torch.Tensor, world: int, fetch: Fetch) -> None:
        self.shape = (world, totals.numel())
        self._world = world
        self._copy = HostCopy({"totals": totals, "keys": keys}, totals.device)
        self._own: torch.Tensor | None = own
        self._fetch: Fetch | None = fetch
        self._decided = False
        self._columns: list[int] = []  # the tensors fetched
        self._per_rank: PerRank | None = None
        self._nonzero: list[tuple[int, int, int]] | None = None

    def _decode(self) -> tuple[list[tuple[int, int, int]], list[int]]:
        host = self._copy.host()
        return ranks_from_keys(host["totals"], host["keys"], self._world)

    def decide(self) -> None:
        """Collective (see the class docstring): fetches each rank's counts of the tensors that need them."""
        if self._decided:
            return
        self._decided = True
        _, self._columns = self._decode()
        if self._columns:
            assert self._own is not None and self._fetch is not None
            index = torch.tensor(self._columns, dtype=torch.int64, device=self._own.device)
            self._per_rank = self._fetch(self._own.index_select(0, index))
        self._own = self._fetch = None  # nothing more to send

    def ready(self) -> bool:
        """Whether ``nonzero()`` can be read without waiting (never waits)."""
        if not self._copy.ready():
            return False
        if self._per_rank is not None:
            return self._per_rank.ready()
        return self._decided or not self._decode()[1]

    def nonzero(self) -> tuple[list[tuple[int, int, int]], bool]:
        """((position, column, count) of every nonzero count, by position then column; whether that is final).
        Waits for the copy and the fetch on first use. Not final only on CUDA tensors before ``decide()``
        ran, for a tensor that needs each rank's count: its lowest and highest rank, from the keys."""
        if self._nonzero is not None:
            return self._nonzero, True
        named, unnamed = self._decode()
        if self._per_rank is not None:
            by_rank = self._per_rank.table()  # [world, K]
            for k, column in enumerate(self._columns):
                named += [(int(r), column, int(by_rank[r, k])) for r in np.flatnonzero(by_rank[:, k])]
        elif unnamed and not self._decided:
            shift, keys = key_shift(self._world), self._copy.host()["keys"]
            mask = (1 << shift) - 1
            for column in unnamed:
                high, low = int(keys[0, column]), int(keys[1, column])
                named += [
                    (self._world - (low >> shift), column, low & mask),
                    ((high >> shift) - 1, column, high & mask),
                ]
            return sorted(named), False
        self._nonzero = sorted(named)
        return self._nonzero, True


class SideBySide:
    """Records of the same ranks read as one (a report's ``RankCounts``), their tensors one after the other:
    one step's passes, several optimizers on one scaler."""

    def __init__(self, records: Sequence[RankRecord]) -> None:
        self.shape = (records[0].shape[0], sum(r.shape[1] for r in records))
        self._records = list(records)

    def ready(self) -> bool:
        return all(r.ready() for r in self._records)

    def nonzero(self) -> tuple[list[tuple[int, int, int]], bool]:
        counts: list[tuple[int, int, int]] = []
        final, offset = True, 0
        for record in self._records:
            some, done = record.nonzero()
            counts += [(row, offset + column, count) for row, column, count in some]
            final, offset = final and done, offset + record.shape[1]
        return sorted(counts), final
