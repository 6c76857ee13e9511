"""Statistics combined across ranks: one picture on N ranks, and the rank that broke the step.

``reduce_stats(stats, group)`` merges the TensorStats of the same T tensors (or the shards of the same T
tensors) held by every rank of a process group into global statistics, each by its merge in the schema of
statistics (amp_inspect/core/statistics.py: counts and histograms summed, amax max, amin_nonzero min, sumsq
summed). It also says how many NaN/Inf each rank held in each tensor, through the record of a fixed size per
tensor of rank_record.py (the rank at position r: row r of ``ShardGroups.ranks``). That is
exact for disjoint pieces of each tensor (FSDP2 shards, or each rank's local gradients before DDP's
all-reduce); replicated gradients (after DDP's all-reduce) would be counted once per rank, so the Inspector
never combines those (see amp_inspect/distributed/ddp.py for DDP).

Cost, over each group of the ShardGroups in turn (one for FSDP2, HSDP or tensor parallel; two for FSDP2 x TP):
two all-reduces issued together, asynchronous where the backend allows: SUM of one packed float64 buffer
(counts, histograms, sums of squares, and this rank's NaN/Inf count of each tensor, exact below 2^53; those
counts are not masked: a replicated tensor names every rank holding NaN/Inf in it, as before); MAX of one int64
buffer: amax and -amin_nonzero as integers in the floats' order (``ordered_bits``), and the record's two keys per
tensor (an int64 key is not exact in a float buffer). With a world of one, nothing is communicated. Bytes per
group, for T tensors and F formats, whatever the world: 8 * T * (5 + 3F + 256 + 1 + 1) + 8 * 4 * T =
8 * T * (267 + 3F). Only on a
step where three or more ranks hold NaN/Inf in K tensors, each rank's counts of those follow: one SUM
all-reduce per group of an int64 [W, K] block, this rank's counts in its row (8 * W * K bytes; the simplest
exact way over several groups, whose ranks' order need not follow the rows). Before issue 32 a [W, T] block
rode in the SUM buffer on every step: 8 * T * (5 + 3F + 256 + 1 + W) + 8 * T.

On host tensors the record is read at once. On CUDA tensors the Combiner reads it at its next combine
(reading it at once would be a host sync), where the per-rank counts follow when needed: until then a report
names, for a tensor that three or more ranks hold NaN/Inf in, its lowest and highest rank only.

Failure: a rank that died, left, or skipped the collective, or ranks holding different models, raise
``DistributedInspectionError`` (a RuntimeError) naming what went wrong, never a hang: on host tensors (gloo)
after at most the timeout; on CUDA tensors (NCCL) through the process group's own timeout and watchdog,
because a timed wait there would stall the host every step (see ``wait_all``).
``Combiner`` checks once, before its first combine, that every rank holds the same tensor layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.distributed as dist

from amp_inspect.core.host_copy import HostCopy
from amp_inspect.core.statistics import MAX, MIN, OUTPUTS, SUM
from amp_inspect.core.tensor_stats import TensorStats
from amp_inspect.distributed.rank_record import PerRank, RankRecord, rank_keys

DEFAULT_TIMEOUT_S = 300.0  # far below the process groups' own defaults (10-30 min), far above step skew


class RankOrigin(NamedTuple):
    """Where a step's NaN/Inf came from in a distributed run: ``nonfinite_by_rank`` is int64 [world, K], the
    NaN/Inf count of each rank's local gradients (``kind`` BEFORE_ALLREDUCE: DDP) or shards (SHARDS: FSDP2) of K
    tensors, whose modules ``module_of_column`` names; ``ranks`` gives each row's global rank. The DDP hook's and
    reduce_stats' are a rank_record.RankRecord, which stands for that table without making it (``shape``,
    ``nonzero()``)."""

    nonfinite_by_rank: Any  # torch.Tensor or rank_record.RankRecord (the report's RankCounts)
    module_of_column: Sequence[str]
    ranks: Sequence[int] | None
    kind: str


class DistributedInspectionError(RuntimeError):
    """A collective of the inspection failed or timed out: a rank died, or the ranks do not match."""


def is_distributed(group: dist.ProcessGroup | None = None) -> bool:
    """Whether a process group of more than one rank is there to combine over."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _dtensor_type() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch without DTensor
        return None
    return DTensor


def to_local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local piece (a view: writing it writes the DTensor), any other tensor itself."""
    dtensor = _dtensor_type()
    return t.to_local() if dtensor is not None and isinstance(t, dtensor) else t


@dataclass(frozen=True, eq=False)
class ShardGroups:
    """Where the other pieces of sharded tensors are, and how to add them up once each.

    ``groups``: the process group of each mesh dimension some tensor is sharded along, reduced one after the
    other (sums and maxima compose, so together they reach every rank holding a piece; the ranks along the
    other dimensions, HSDP's replicas, hold the same pieces and are left alone). ``contributes``: which tensors
    this rank adds (None: all). A tensor replicated along one of those dimensions (tensor parallel's rowwise
    bias, a replicated norm weight) is added by the ranks at coordinate 0 of that dimension alone, so that it
    counts once. ``ranks``: the global rank of each row of a per-rank table, row-major over ``groups``;
    ``row``: this rank's row."""

    groups: tuple[dist.ProcessGroup, ...]
    contributes: tuple[bool, ...] | None
    ranks: tuple[int, ...]
    row: int

    @classmethod
    def of_group(cls, group: dist.ProcessGroup | None) -> ShardGroups:
        """One group, every tensor a disjoint piece on each of its ranks (FSDP2, or a user's ``group=``)."""
        return cls((group,), None, global_ranks(group), dist.get_rank(group) if is_distributed(group) else 0)

    @property
    def key(self) -> tuple[object, ...]:
        return (*(id(g) for g in self.groups), self.contributes)

    @property
    def distributed(self) -> bool:
        return len(self.ranks) > 1

    def masked(self, outputs: Sequence[torch.Tensor], identities: Sequence[float]) -> list[torch.Tensor]:
        """``outputs`` (first dimension: the tensors) with the tensors this rank does not add set to each
        output's ``identity`` (0 for a sum, -inf for a maximum)."""
        if self.contributes is None:
            return list(outputs)
        keep = torch.tensor(self.contributes, device=outputs[0].device)
        return [
            torch.where(keep.reshape(-1, *([1] * (o.dim() - 1))), o, torch.full((), i, dtype=o.dtype, device=o.device))
            for o, i in zip(outputs, identities, strict=True)
        ]

    def all_reduce(
        self,
        summed: torch.Tensor,
        maxed: torch.Tensor | Sequence[torch.Tensor] | None,
        timeout_s: float,
        what: str,
        device: torch.device,
    ) -> None:
        """In place: ``summed`` summed and ``maxed`` (a tensor, or several) maximised over every rank of the
        groups, a group after the other (on CUDA each wait orders the stream only: no host sync)."""
        maxima = [] if maxed is None else [maxed] if isinstance(maxed, torch.Tensor) else list(maxed)
        for group in self.groups:
            works = [dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group, async_op=True)]
            works += [dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group, async_op=True) for m in maxima]
            wait_all(works, timeout_s, what, group, device)


def _is_shard(placement: object) -> bool:
    """A placement that gives each rank a disjoint piece: Shard, and FSDP2's _StridedShard (FSDP2 over a
    tensor-parallel shard: the same pieces, strided), which answers is_shard() False on some torch versions."""
    return bool(placement.is_shard()) or type(placement).__name__ == "_StridedShard"  # type: ignore[attr-defined]


def _adds_once(placements: Sequence[object], coordinate: Sequence[int], dims: Iterable[int]) -> bool:
    """Whether this rank adds its piece of a tensor placed as ``placements`` when pieces are summed over the mesh
    dimensions ``dims``: along each of them it is replicated on, the rank at coordinate 0 alone adds it."""
    return all(coordinate[d] == 0 for d in dims if placements[d].is_replicate())  # type: ignore[attr-defined]


def added_here(t: torch.Tensor) -> bool:
    """Whether this rank's piece of ``t`` is added when every rank's pieces are summed: a DTensor replicated along
    a dimension of its mesh only at coordinate 0 of it (so it counts once there); any other tensor always."""
    dtensor = _dtensor_type()
    if dtensor is None or not isinstance(t, dtensor):
        return True
    coordinate = t.device_mesh.get_coordinate()
    return coordinate is not None and _adds_once(t.placements, coordinate, range(t.device_mesh.ndim))


def local_shards(grads: list[torch.Tensor]) -> tuple[list[torch.Tensor], ShardGroups | None, str | None]:
    """The tensors to inspect on this rank: a DTensor (FSDP2, HSDP, tensor parallel, FSDP2 x TP) is replaced by
    its local piece. Returns (tensors, where the other pieces are, why not). The ShardGroups are set when every
    tensor is a DTensor on one mesh, with Shard and Replicate placements only: reduce_stats then makes
    whole-tensor statistics of the pieces over the mesh dimensions the tensors are sharded along, each tensor
    counted once (see ShardGroups). Otherwise None, and the reason says why the statistics are partial (fully
    replicated DTensors need no combining: no reason)."""
    dtensor = _dtensor_type()
    if dtensor is None:  # pragma: no cover - torch without DTensor
        return grads, None, None
    local, meshes, placements = [], set(), []
    for g in grads:
        if isinstance(g, dtensor):
            local.append(g.to_local())
            meshes.add(g.device_mesh)
            placements.append(tuple(g.placements))
        else:
            local.append(g)
    if not meshes:
        return local, None, None
    if len(meshes) > 1:
        return local, None, "DTensor gradients on several meshes: statistics are of this rank's local pieces"
    if len(placements) != len(grads):
        return local, None, "a mix of DTensor and plain gradients: statistics are of this rank's local pieces"
    if not all(_is_shard(q) or q.is_replicate() for p in placements for q in p):
        return (
            local,
            None,
            "DTensor gradients with placements other than Shard and Replicate (a partial sum): statistics are of "
            "this rank's local pieces",
        )
    mesh = next(iter(meshes))
    sharded = sorted({d for p in placements for d, q in enumerate(p) if _is_shard(q)})
    if not sharded:
        return local, None, None  # replicated everywhere: every rank holds the whole gradients
    coordinate = mesh.get_coordinate()
    assert coordinate is not None, "a rank holding a DTensor is on its mesh"
    contributes = tuple(_adds_once(p, coordinate, sharded) for p in placements)
    rows = mesh.mesh[tuple(slice(None) if d in sharded else coordinate[d] for d in range(mesh.ndim))]
    row = 0
    for d in sharded:
        row = row * mesh.size(d) + coordinate[d]
    return (
        local,
        ShardGroups(
            tuple(mesh.get_group(d) for d in sharded),
            None if all(contributes) else contributes,
            tuple(int(r) for r in rows.flatten().tolist()),
            row,
        ),
        None,
    )


def sharded_groups(grads: Sequence[torch.Tensor]) -> list[dist.ProcessGroup]:
    """The process groups of every mesh dimension along which some DTensor in ``grads`` is not replicated, in
    a fixed order: where GradScaler's found_inf must agree (torch's DTensor unscale reduces it over exactly
    these), when the statistics themselves are not combined."""
    dtensor = _dtensor_type()
    groups: dict[int, dist.ProcessGroup] = {}
    for g in grads:
        if dtensor is not None and isinstance(g, dtensor):
            for dim, placement in enumerate(g.placements):
                if not placement.is_replicate():
                    group = g.device_mesh.get_group(dim)
                    groups.setdefault(id(group), group)
    return [g for g in groups.values() if dist.get_world_size(g) > 1]


def global_ranks(group: dist.ProcessGroup | None) -> tuple[int, ...]:
    """The global rank of each rank of ``group``, in group-rank order (reports name global ranks: with DDP
    or FSDP over a subgroup, as in pipeline or hybrid parallelism, the group's rank 1 is not global rank 1)."""
    if not (dist.is_available() and dist.is_initialized()):
        return (0,)
    if group is None or group is dist.group.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_global_rank(group, r) for r in range(dist.get_world_size(group)))


@dataclass(frozen=True)
class GlobalStats:
    stats: TensorStats  # statistics over every rank's pieces
    # Each rank's NaN/Inf count of its piece of each tensor, as the record of rank_record.py (positions: rows of
    # ``ranks``): what a report reads (RankCounts), without the [world, T] table.
    record: RankRecord
    # int64 [T] on the device: those counts summed over the ranks (a replicated tensor's on every rank holding
    # it, as the record has them), for decisions made without a host sync.
    totals: torch.Tensor
    ranks: tuple[int, ...] = (0,)  # the global rank of each position of the record

    @property
    def nonfinite_by_rank(self) -> torch.Tensor:
        """int64 [world, T] on the host, made from the record: waits for it (a host sync on CUDA; before the
        Combiner's next combine read a CUDA record, a tensor three or more ranks hold NaN/Inf in has its lowest
        and highest rank only). For one-off reads: reports read the record itself."""
        table = torch.zeros(self.record.shape, dtype=torch.int64)
        for row, column, count in self.record.nonzero()[0]:
            table[row, column] = count
        return table

    @property
    def ranks_with_inf(self) -> torch.Tensor:
        """bool [world]: which ranks held NaN/Inf in their pieces (made from the record: see nonfinite_by_rank)."""
        return self.nonfinite_by_rank.sum(dim=1) > 0


def wait_all(
    works: Sequence[dist.Work], timeout_s: float, what: str, group: dist.ProcessGroup | None, device: torch.device
) -> None:
    """Waits for ``works`` and turns any failure into a DistributedInspectionError that says what was being
    combined and what usually causes it. For host tensors (gloo) the wait lasts at most ``timeout_s``. For
    CUDA tensors it only orders the current stream after the collective: NCCL turns a timed wait into a busy
    wait of the host, a sync on every step; there the process group's own timeout and watchdog apply."""
    try:
        for work in works:
            if device.type == "cuda":
                work.wait()
            else:
                work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as error:
        world = dist.get_world_size(group)
        raise DistributedInspectionError(
            f"amp_inspect: {what} across {world} ranks failed or took longer than {timeout_s:g} s (on CUDA tensors: "
            "the process group's own timeout). A rank may have "
            "died or left the group, or not inspected this step: every rank must call check() (and run the "
            f"scaler's step) on the same steps, with the same model. Cause: {error}"
        ) from error


def _decide_at_once(device: torch.device) -> bool:
    """Whether the Combiner reads a combine's record at once: on host tensors it is there; on CUDA tensors
    reading it would wait for the device (a host sync every step), so its next combine reads it."""
    return device.type == "cpu"


class _CountsByRow:
    """rank_record's Fetch for reduce_stats: each rank's counts of K tensors as an int64 [world, K] block, this
    rank's in its row (``ShardGroups.row``), SUM all-reduced over each group in turn: the rows come out as the
    record's positions whatever order each group's ranks take (an all-gather's order), for one group or several."""

    def __init__(self, mine: torch.Tensor, shards: ShardGroups, timeout_s: float) -> None:
        block = torch.zeros(len(shards.ranks), mine.numel(), dtype=torch.int64, device=mine.device)
        block[shards.row] = mine
        shards.all_reduce(block, None, timeout_s, "gathering each rank's NaN/Inf counts", mine.device)
        self._copy = HostCopy({"table": block}, mine.device)

    def ready(self) -> bool:
        return self._copy.ready()

    def table(self) -> np.ndarray:
        return self._copy.host()["table"]


def reduce_stats(
    stats: TensorStats,
    group: dist.ProcessGroup | ShardGroups | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    decide: bool = True,
) -> GlobalStats:
    """Combines every rank's statistics of the same T tensors (see the module docstring): each output of the
    schema (amp_inspect/core/statistics.py) by its statistics' merge. Collective: every rank of ``group`` (of
    each of its groups) must call it with statistics of the same shape, in the same order. ``decide``: read the
    record at once (a host sync on CUDA tensors) and fetch each rank's counts where it needs them; with False
    the caller calls ``record.decide()`` later, at the same point on every rank (the Combiner, on CUDA)."""
    shards = group if isinstance(group, ShardGroups) else ShardGroups.of_group(group)
    outputs = stats.outputs()
    device = outputs[0].device
    own = stats.nonfinite  # int64 [T]: this rank's NaN/Inf counts, of the tensors it does not add too
    if not shards.distributed:
        record = RankRecord(own, rank_keys(own, 0, 1), own, 1, _nothing_to_fetch)
        return GlobalStats(stats, record, own)
    world, row = len(shards.ranks), shards.row
    summed = [k for k, o in enumerate(OUTPUTS) if o.merge == SUM]
    extreme = [k for k, o in enumerate(OUTPUTS) if o.merge in (MAX, MIN)]
    # One SUM buffer: the summed outputs as float64 (counts exact below 2^53), and this rank's NaN/Inf counts (the
    # record's sum). A tensor this rank does not add is zero in the outputs, but its NaN/Inf still name the rank.
    added = shards.masked([outputs[k].double() for k in summed], [0.0] * len(summed))
    packed = torch.cat([*(o.flatten() for o in added), own.double()])
    # One MAX buffer, int64: the maxima, and the minima negated (min(x) = -max(-x), exact: negation only flips the
    # sign), as integers in the floats' order (ordered_bits: exact, both ways), then the record's keys (an int64 key
    # is not exact in a float). One collective for both, not two: on a small world a collective's latency is most of
    # its cost. In float32 when every extreme is (it is today), else float64. A tensor this rank does not add is -inf.
    common = outputs[extreme[0]].dtype if len({outputs[k].dtype for k in extreme}) == 1 else torch.float64
    sent = [outputs[k].to(common) for k in extreme]
    signed = [t if OUTPUTS[k].merge == MAX else -t for k, t in zip(extreme, sent, strict=True)]
    extremes = torch.cat([t.flatten() for t in shards.masked(signed, [-math.inf] * len(signed))])
    keys = rank_keys(own, row, world)
    maxed = torch.cat([ordered_bits(extremes), keys.flatten()])
    shards.all_reduce(packed, maxed, timeout_s, "combining the gradient statistics", device)
    extremes_piece, keys_piece = maxed.split([extremes.numel(), keys.numel()])
    extremes, keys = from_ordered_bits(extremes_piece, common), keys_piece.reshape(keys.shape)
    merged: list[torch.Tensor] = list(outputs)
    *summed_pieces, totals_piece = packed.split([*(outputs[k].numel() for k in summed), len(stats)])
    for k, piece in zip(summed, summed_pieces, strict=True):
        merged[k] = _as_output(piece, outputs[k])
    for k, piece in zip(extreme, extremes.split([outputs[k].numel() for k in extreme]), strict=True):
        merged[k] = _as_output(piece if OUTPUTS[k].merge == MAX else -piece, outputs[k])
    totals = totals_piece.round().to(torch.int64)
    fetch = functools.partial(_CountsByRow, shards=shards, timeout_s=timeout_s)
    record = RankRecord(totals, keys, own, world, fetch)
    if decide:
        record.decide()
    return GlobalStats(TensorStats.from_op_outputs(merged, stats.formats), record, totals, shards.ranks)


def _bits_dtype(dtype: torch.dtype) -> torch.dtype:
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"ordered_bits takes float32 or float64, not {dtype}")
    return torch.int32 if dtype == torch.float32 else torch.int64


def ordered_bits(t: torch.Tensor) -> torch.Tensor:
    """Float32 or float64 values as int64 in the same order (-inf < ... < -0 < +0 < ... < +inf): the IEEE bits,
    the magnitude bits of a negative value flipped (its bits as a signed integer run the wrong way). A MAX over
    these is the MAX over the floats, and from_ordered_bits gives the floats back exactly."""
    bits_dtype = _bits_dtype(t.dtype)
    bits = t.contiguous().view(bits_dtype)
    flipped = torch.where(bits < 0, bits ^ torch.iinfo(bits_dtype).max, bits)
    return flipped.to(torch.int64)


def from_ordered_bits(ordered: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The floats of ``dtype`` that ordered_bits made ``ordered`` of (the flip is its own inverse)."""
    bits_dtype = _bits_dtype(dtype)
    bits = ordered.to(bits_dtype)  # exact: every value came from bits_dtype
    return torch.where(bits < 0, bits ^ torch.iinfo(bits_dtype).max, bits).view(dtype)


def _nothing_to_fetch(mine: torch.Tensor) -> PerRank:
    raise AssertionError("a record of one rank names it: nothing to fetch")


def _as_output(piece: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A merged buffer's piece back in the output's dtype and shape (counts rounded: exact below 2^53)."""
    if not like.dtype.is_floating_point:
        piece = piece.round()
    return piece.to(like.dtype).reshape(like.shape)


def layout_key(shapes: Sequence[Sequence[int]]) -> int:
    """A 31-bit fingerprint of the tensors' global shapes, in order: equal on ranks holding the same model."""
    text = ";".join("x".join(str(int(n)) for n in shape) for shape in shapes)
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def check_same_layout(
    shapes: Sequence[Sequence[int]], group: dist.ProcessGroup | None, device: torch.device, timeout_s: float
) -> None:
    """Collective: raises DistributedInspectionError on every rank unless all ranks of ``group`` hold tensors
    of the same global shapes in the same order (one all-reduce of 2 * world int64)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    table = torch.zeros(world, 2, dtype=torch.int64, device=device)
    table[rank, 0] = len(shapes)
    table[rank, 1] = layout_key(shapes)
    work = dist.all_reduce(table, group=group, async_op=True)
    wait_all([work], timeout_s, "checking the tensor layout", group, device)
    rows = table.tolist()
    differ = [r for r, row in enumerate(rows) if row != rows[0]]
    if differ:
        ranks = global_ranks(group)  # as reports name them
        others = []
        for r in differ:
            others.append(
                f"rank {ranks[r]} has {rows[r][0]}" + (" of other shapes" if rows[r][0] == rows[0][0] else "")
            )
        raise DistributedInspectionError(
            f"amp_inspect: the ranks do not hold the same gradients to combine: rank {ranks[0]} has {rows[0][0]} "
            f"tensors, {', '.join(others)}. Attach the inspector to the same model on every rank of the group."
        )


def combined_over(shards: ShardGroups | None, chosen: dist.ProcessGroup | None) -> ShardGroups | None:
    """Where pieces sharded as ``shards`` say are combined: over ``chosen`` (the user's ``group=``) when given,
    each tensor still added once; None when there is nothing to combine (not sharded, or one rank)."""
    if shards is None:
        return None
    if chosen is not None:
        shards = dataclasses.replace(ShardGroups.of_group(chosen), contributes=shards.contributes)
    return shards if shards.distributed else None


class Combiner:
    """reduce_stats over one group (or ShardGroups), with the layout check made once per layout this rank
    combines (several optimizers each have theirs), before its first combine. Ranks whose layouts differ from
    the start all fail that check; a rank whose layout changes later, alone, runs the check while the others
    combine: a collective mismatch, which gloo reports as an error (or a crash of that rank) and NCCL may not.
    On CUDA tensors each combine's record is read (``decide()``) at the next combine, without a host sync."""

    def __init__(self, group: dist.ProcessGroup | ShardGroups | None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.shards = group if isinstance(group, ShardGroups) else ShardGroups.of_group(group)
        self.timeout_s = timeout_s
        self._checked: set[tuple[tuple[int, ...], ...]] = set()
        self._undecided: list[RankRecord] = []  # combined on CUDA tensors: read at the next combine

    def combine(self, stats: TensorStats, shapes: Sequence[Sequence[int]]) -> GlobalStats:
        layout = tuple(tuple(int(n) for n in shape) for shape in shapes)
        if layout not in self._checked and self.shards.distributed:
            for group in self.shards.groups:
                if is_distributed(group):
                    check_same_layout(layout, group, stats.numel.device, self.timeout_s)
            self._checked.add(layout)
        # Every rank combines the same steps in the same order: each reads the earlier records here alike.
        for record in self._undecided:
            record.decide()
        self._undecided.clear()
        at_once = _decide_at_once(stats.numel.device)
        merged = reduce_stats(stats, self.shards, self.timeout_s, decide=at_once)
        if not at_once:
            self._undecided.append(merged.record)
        return merged


class Combiners:
    """The Combiner for each set of process groups sharded gradients are combined over (the Inspector and the
    InspectingGradScaler each keep one set: a Combiner remembers the layouts it has checked)."""

    def __init__(self) -> None:
        self._by_group: dict[tuple[object, ...], Combiner] = {}

    def over(self, shards: ShardGroups | None, chosen: dist.ProcessGroup | None, timeout_s: float) -> Combiner | None:
        """The Combiner for gradients sharded as ``shards`` say (None: not sharded), or over ``chosen`` (the
        user's ``group=``) when given, each tensor still added once; None when there is nothing to combine (not
        sharded, or one rank)."""
        shards = combined_over(shards, chosen)
        if shards is None:
            return None
        combiner = self._by_group.get(shards.key)
        if combiner is None:
            combiner = self._by_group[shards.key] = Combiner(shards, timeout_s)
        return combiner


def log_path_of_rank(
    log: str | os.PathLike[str], all_ranks: bool, group: dist.ProcessGroup | None = None
) -> str | os.PathLike[str] | None:
    """Where this rank writes the log. In a distributed run the reports are the same on every rank of the
    group the inspector reports over (``group``, default the world), so its first rank alone writes: ``log``
    when the group is the world; ``<stem>.rank<r><suffix>`` (r: global rank) when there are several groups
    (DDP over subgroups), each with its own reports. With ``all_ranks`` every rank r writes the latter."""
    if not is_distributed():
        return log
    rank = dist.get_rank()
    path = Path(log).expanduser()
    own_file = path.with_name(f"{path.stem}.rank{rank}{path.suffix}")
    if all_ranks:
        return own_file
    if group is not None and global_ranks(group) != tuple(range(dist.get_world_size())):
        return own_file if dist.get_rank(group) == 0 else None
    return log if rank == 0 else None
