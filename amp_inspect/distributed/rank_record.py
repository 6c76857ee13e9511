"""The DDP hook's per-step record of where NaN/Inf were: a fixed size per parameter tensor, whatever the world.

Each rank puts its own NaN/Inf count of each of the T tensors into two all-reduces (issued together,
asynchronously): SUM of the counts (int64 [T]) and MAX of two keys per tensor (int64 [2, T]), each key a rank
and that rank's count in one integer, ``key = position << shift | count`` (0 where the rank has none):

- the *high* key, position ``rank + 1``: its maximum holds the highest rank with NaN/Inf and its count;
- the *low* key, position ``world - rank``: its maximum holds the lowest rank with NaN/Inf and its count.

That names every rank exactly when at most two ranks hold NaN/Inf in a tensor: one (the low and the high
key name the same rank, whose count is the sum) or two (their counts add up to the sum; a third rank would add
at least one). Only a tensor that three or more ranks hold NaN/Inf in (or two with a count too large for its
key) needs each rank's count: then, and only then, one all-gather of this rank's counts of those K tensors
follows (``detail``), once for the step. Bytes per step: 24 * T, plus 8 * K per rank gathered on such a step.

``shift`` leaves the position bits for ``world``: 63 - world.bit_length() bits of count (48 at 16,384 ranks,
counts below 2.8e14 per tensor; a larger count saturates and the tensor takes the gather).
"""

from __future__ import annotations

from collections.abc import Callable

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


class RankRecord:
    """One step's record (see the module docstring), on its way to the host: what a report reads as the NaN/Inf
    count of each rank (group-rank rows) and tensor, through ``nonzero()`` (a report's ``RankCounts``).
    ``shape`` is (world, T), the table it stands for (never made).

    ``decide()`` reads the record on the host and, when some tensor needs each rank's count, starts the one
    all-gather of ``own`` (this rank's counts). It is collective: the owner calls it at the same point on every
    rank (every rank reads the same record, so all decide alike). On host tensors the owner calls it at once;
    on CUDA tensors at its next synchronised backward, when the copy has long arrived (reading it at once would
    be a host sync). A report read before then names, for such a tensor, its lowest and highest rank only."""

    def __init__(
        self,
        totals: torch.Tensor,
        keys: torch.Tensor,
        own: torch.Tensor,
        world: int,
        wait: Callable[[list[dist.Work], torch.device], None],
    ) -> None:
        self.shape = (world, totals.numel())
        self._world = world
        self._copy = HostCopy({"totals": totals, "keys": keys}, totals.device)
        self._own = own
        self._wait = wait  # waits for a collective of the group (combine.wait_all, with the owner's timeout)
        self._decided = False
        self._columns: list[int] = []  # the tensors gathered
        self._gathered: list[torch.Tensor] = []  # one int64 [K] per rank, complete once _work is
        self._work: dist.Work | None = None
        self._nonzero: list[tuple[int, int, int]] | None = None

    def _decode(self) -> tuple[list[tuple[int, int, int]], list[int]]:
        host = self._copy.host()
        return ranks_from_keys(host["totals"], host["keys"], self._world)

    def decide(self, group: dist.ProcessGroup | None) -> None:
        """Collective (see the class docstring): gathers each rank's counts of the tensors that need them."""
        if self._decided:
            return
        self._decided = True
        _, self._columns = self._decode()
        if self._columns:
            index = torch.tensor(self._columns, dtype=torch.int64, device=self._own.device)
            mine = self._own.index_select(0, index)
            self._gathered = [torch.empty_like(mine) for _ in range(self._world)]
            self._work = dist.all_gather(self._gathered, mine, group=group, async_op=True)
        self._own = None  # type: ignore[assignment]  # nothing more to send

    def ready(self) -> bool:
        """Whether ``nonzero()`` can be read without waiting (never waits)."""
        if not self._copy.ready():
            return False
        if self._work is not None:
            return self._work.is_completed()
        return self._decided or not self._decode()[1]

    def nonzero(self) -> tuple[list[tuple[int, int, int]], bool]:
        """((group rank, column, count) of every nonzero count, by rank then column; whether that is final).
        Waits for the copy and the all-gather on first use. Not final only on CUDA tensors before ``decide()``
        ran, for a tensor that needs each rank's count: its lowest and highest rank, from the keys."""
        if self._nonzero is not None:
            return self._nonzero, True
        named, unnamed = self._decode()
        if self._work is not None:
            self._wait([self._work], self._gathered[0].device)
            by_rank = torch.stack(self._gathered).cpu().numpy()  # [world, K]
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
