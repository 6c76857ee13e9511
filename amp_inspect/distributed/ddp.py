"""DDP: find the rank and module that produced a NaN/Inf, before the all-reduce spreads it to every rank.

After DDP's all-reduce every rank holds the same averaged gradients, so a NaN made on rank 3 is on all ranks
and a check there cannot say where it came from. ``ddp_comm_hook`` runs where DDP hands each gradient bucket
to the network: it counts NaN/Inf in this rank's own gradients of the bucket (the fused op over the bucket's
views, one pass), then averages exactly as DDP without a hook does, over DDP's process group, so training is
bitwise the same. After the last bucket, a record of a fixed size per parameter tensor (rank_record.py: the
counts summed, and the lowest and highest rank holding NaN/Inf with their counts; two all-reduces issued
asynchronously, waited for where the step's report takes them) tells every rank which ranks made them; the
report takes it as ``inf_by_rank``. Only a step on which three or more ranks hold NaN/Inf in one tensor
gathers each rank's count of such tensors, once.

The report's other statistics stay those of the averaged gradients (what GradScaler and the optimizer see,
identical on every rank of the group): its total_norm is the one to clip with.

    insp = amp_inspect.attach(ddp_model, scaler)   # registers the hook (ddp_hook=False to opt out)
    # or, by hand, before the first backward, with attach(ddp_model, ddp_hook=False):
    ddp_model.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)

Whoever takes the counts (the inspector ``attach`` registers the hook for) is the hook's *listener*, a
``HookListener``: it gives the hook the ``NonfiniteByRank`` to count into and the number of the step now running.

Cost per synchronised backward: one read of the gradients inside backward (the fused op, per bucket; on
the host a cheaper finite-sum test first) and 24 * T bytes all-reduced (T: parameter tensors), whatever the
world; on a step where three or more ranks hold NaN/Inf in K tensors, one all-gather of 8 * K bytes per rank
more. The record is read on the host without a sync: at once on host tensors (gloo); on CUDA tensors at the
next synchronised backward, so that such a step's gather comes one step later (docs/distributed.md).
"""

# No ``from __future__ import annotations``: DDP compares the hook's annotations with real types.

import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from amp_inspect.core.tensor_stats import tensor_stats
from amp_inspect.core.torch_compat import ddp_comm_hooks
from amp_inspect.distributed.combine import DEFAULT_TIMEOUT_S, RankOrigin, global_ranks, is_distributed, wait_all
from amp_inspect.distributed.rank_record import Gathered, RankRecord, rank_keys
from amp_inspect.evidence.attribution import BEFORE_ALLREDUCE
from amp_inspect.model.naming import ParamEntry
from amp_inspect.model.view import ModelView
from amp_inspect.model.wrappers import refuse_sparse_with_comm_hook

# The hook only needs NaN/Inf counts, which every format's statistics include; one format keeps it lean.
_HOOK_FORMATS = ("fp16",)


@dataclass
class _Exchange:
    """One backward's record (rank_record.py) in flight: the NaN/Inf counts summed and the ranks' keys."""

    step: int  # the listener's step during that backward
    works: list[dist.Work]
    totals: torch.Tensor  # int64 [T], SUM over the ranks, complete once works are
    keys: torch.Tensor  # int64 [2, T], MAX over the ranks, complete once works are
    own: torch.Tensor  # int64 [T]: this rank's counts
    earlier: "_Record | None"  # the same step's earlier backward (accumulation without no_sync), complete


@dataclass
class _Record:
    """A completed record and this rank's counts behind it."""

    totals: torch.Tensor
    keys: torch.Tensor
    own: torch.Tensor


def _surely_finite(buffer: torch.Tensor) -> bool:
    """On the host, a finite sum of a flat bucket proves every value finite, at a quarter of the fused pass's
    cost (measured on this project's CPU); a NaN/Inf, or a sum that overflows, leaves it to the exact count.
    On a GPU the answer would cost a host sync, and the fused pass is one read of the bucket anyway: False."""
    return buffer.device.type == "cpu" and bool(torch.isfinite(buffer.sum()))


def _read_at_take(device: torch.device) -> bool:
    """Whether take() reads the step's record at once: on host tensors it is there; on CUDA tensors reading it
    would wait for the device (a host sync every step), so the next synchronised backward reads it."""
    return device.type == "cpu"


class HookListener(Protocol):
    """What ddp_comm_hook needs from whoever takes its counts (the inspector ``attach`` registers it for)."""

    def nonfinite_by_rank(self) -> "NonfiniteByRank":
        """Where the hook counts this rank's NaN/Inf (the same object every call)."""
        ...

    def step_in_progress(self) -> int:
        """The number the report of the step now running will carry."""
        ...


class HookState:
    """The comm hook's state, one per DDP model: the averaging DDP would do without a hook, and the listener
    the counts go to (None once it detached). ``attach`` keeps it on the DDP model, so a later ``attach``
    rebinds it: DDP cannot register a second hook, nor remove one."""

    def __init__(self, ddp: nn.parallel.DistributedDataParallel, listener: HookListener | None) -> None:
        self.listener = listener
        self.group = ddp.process_group  # not the DDP model itself: see ``listener``
        self.world = dist.get_world_size(self.group)
        # DDP without a hook multiplies a gradient it copies into its bucket by 1/world, but divides one that
        # already lives there (gradient_as_bucket_view): the two round differently unless world is a power of
        # two. DDP's test, whether .grad is the bucket's view when the gradient is ready, is redone here from
        # where each .grad was right after its accumulation (a hook that runs just before DDP's own).
        self._grad_at: dict[int, int] = {}  # id(param) -> .grad's data_ptr after this backward's accumulation
        self._exact_division = ddp.gradient_as_bucket_view and self.world & (self.world - 1) != 0
        if self._exact_division:
            for p in ddp.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._record_grad_address)

    # Held weakly: DDP's C++ reducer holds this state, and a strong path back to the DDP model (the listener
    # holds it) would be a cycle Python's collector cannot see through; it would live until interpreter exit
    # and tear down after the process group (gloo was seen to abort the process there). A dropped listener
    # stops the counting; the averaging goes on.
    @property
    def listener(self) -> HookListener | None:
        return self._listener() if self._listener is not None else None

    @listener.setter
    def listener(self, listener: HookListener | None) -> None:
        self._listener = weakref.ref(listener) if listener is not None else None

    def _record_grad_address(self, param: torch.Tensor) -> None:
        self._grad_at[id(param)] = param.grad.data_ptr()

    def _in_bucket(self, param: torch.Tensor, view: torch.Tensor) -> bool:
        address = self._grad_at.pop(id(param), None)
        if address is None:  # no gradient this backward (unused): DDP looks at .grad as it is
            address = param.grad.data_ptr() if param.grad is not None else None
        return address == view.data_ptr()

    def average(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """Averages the bucket over DDP's group as DDP's reducer does without a hook (asynchronously)."""
        buffer = bucket.buffer()
        if not self._exact_division:
            buffer.mul_(1.0 / self.world)  # a double scalar, as DDP's reducer: not div_ (torch's allreduce_hook)
        else:
            views = bucket.gradients()
            in_bucket = [self._in_bucket(p, v) for p, v in zip(bucket.parameters(), views, strict=True)]
            if all(in_bucket):
                buffer.div_(self.world)
            elif not any(in_bucket):
                buffer.mul_(1.0 / self.world)
            else:
                for view, divide in zip(views, in_bucket, strict=True):
                    if divide:
                        view.div_(self.world)
                    else:
                        view.mul_(1.0 / self.world)
        work = dist.all_reduce(buffer, group=self.group, async_op=True)
        return work.get_future().then(lambda fut: fut.value()[0])


class NonfiniteByRank:
    """Per-rank NaN/Inf counts of each parameter's local gradient (before the all-reduce averages them),
    gathered by ``ddp_comm_hook`` for one listener, and their exchange between the ranks: a record of a fixed
    size per tensor every backward, each rank's counts only on a step that needs them (rank_record.py)."""

    def __init__(
        self, ddp: nn.parallel.DistributedDataParallel, entries: list[ParamEntry], timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        self.group = ddp.process_group
        self.world = dist.get_world_size(self.group)
        self.timeout_s = timeout_s
        self.ranks = global_ranks(self.group)  # the global rank of each row of the counts
        self.modules = [e.module for e in entries]  # the column names of the counts
        self._column_of_param = {id(e.param): i for i, e in enumerate(entries)}
        self._columns: dict[int, tuple[tuple[int, ...], torch.Tensor]] = {}  # bucket index -> (param ids, index)
        self._counts: torch.Tensor | None = None  # this rank's counts, filled bucket by bucket
        self._pending: _Exchange | None = None
        self._taken: tuple[int, RankRecord] | None = None  # the last (step, record) handed to a report
        self._undecided: list[RankRecord] = []  # taken on CUDA tensors: decided at the next backward

    # ---- counting ----

    def _bucket_columns(self, bucket: dist.GradBucket, device: torch.device) -> torch.Tensor:
        # DDP rebuilds its buckets after the first iteration: the cache is keyed by the parameters too.
        ids = tuple(id(p) for p in bucket.parameters())
        cached = self._columns.get(bucket.index())
        if cached is None or cached[0] != ids:
            if any(i not in self._column_of_param for i in ids):
                raise RuntimeError(
                    "amp_inspect.ddp_comm_hook: DDP reduces parameters this inspector does not know; register the "
                    "hook with the inspector attached to the same DDP model"
                )
            index = torch.tensor([self._column_of_param[i] for i in ids], dtype=torch.int64, device=device)
            cached = self._columns[bucket.index()] = (ids, index)
        return cached[1]

    def bucket_ready(self, bucket: dist.GradBucket, step: int) -> None:
        """Counts NaN/Inf in this rank's gradients of ``bucket``; after the last bucket, starts the exchange."""
        grads = bucket.gradients()
        if grads:
            device = grads[0].device
            if self._counts is None:
                self._counts = torch.zeros(len(self.modules), dtype=torch.int64, device=device)
            columns = self._bucket_columns(bucket, device)  # before any shortcut: its error must hit every rank
            if not _surely_finite(bucket.buffer()):
                with torch.no_grad():
                    stats = tensor_stats(grads, formats=_HOOK_FORMATS)
                    self._counts.index_copy_(0, columns, stats.nonfinite)
        if bucket.is_last() and self._counts is not None:
            self._exchange(self._counts, step)
            self._counts = None

    def _exchange(self, counts: torch.Tensor, step: int) -> None:
        earlier = None
        if self._pending is not None:
            previous = self._complete(self._pending)
            # Several backwards in one step without no_sync: after the first all-reduce a NaN is in every rank's
            # .grad, so the first backward that saw any says where it came from.
            earlier = previous if self._pending.step == step else None
        # Records taken on CUDA tensors are read here, a backward later (every rank passes here alike): their
        # copies arrived long ago, where reading at take() would have waited for the device.
        for record in self._undecided:
            record.decide()
        self._undecided.clear()
        totals = counts.clone()  # reduced in place; ``counts`` stays this rank's own
        keys = rank_keys(counts, dist.get_rank(self.group), self.world)
        works = [
            dist.all_reduce(totals, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
            dist.all_reduce(keys, op=dist.ReduceOp.MAX, group=self.group, async_op=True),
        ]
        self._pending = _Exchange(step, works, totals, keys, counts, earlier)

    def _wait(self, works: list[dist.Work], device: torch.device) -> None:
        wait_all(works, self.timeout_s, "exchanging the NaN/Inf counts before the all-reduce", self.group, device)

    def _gather(self, mine: torch.Tensor) -> Gathered:
        return Gathered(mine, self.group, self._wait)

    def _complete(self, exchange: _Exchange) -> _Record:
        self._wait(exchange.works, exchange.totals.device)
        record = _Record(exchange.totals, exchange.keys, exchange.own)
        earlier = exchange.earlier
        if earlier is None:
            return record
        # No host sync: the earlier record (and this rank's counts behind it) if it has any count, else this one.
        use = earlier.totals.sum() > 0
        return _Record(
            torch.where(use, earlier.totals, record.totals),
            torch.where(use, earlier.keys, record.keys),
            torch.where(use, earlier.own, record.own),
        )

    def take(self, step: int) -> RankRecord | None:
        """Every rank's counts for ``step`` (a RankRecord: int64 [world, parameter tensors] as the report reads
        it), or None when no synchronised backward ran in that step. Waits for the exchange (see wait_all for
        how long); on host tensors, gathers each rank's counts where the record needs them (collective: every
        rank takes the same steps, as every rank calls check() on the same steps)."""
        if self._taken is not None and self._taken[0] == step:
            return self._taken[1]  # a second report of the same step
        if self._pending is None or self._pending.step != step:
            return None
        done = self._complete(self._pending)
        self._pending = None
        record = RankRecord(done.totals, done.keys, done.own, self.world, self._gather)
        if _read_at_take(done.totals.device):
            record.decide()
        else:
            self._undecided.append(record)
        self._taken = (step, record)
        return record


def ddp_comm_hook(state: HookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook (``ddp_model.register_comm_hook(insp, amp_inspect.ddp_comm_hook)``): counts NaN/Inf
    in this rank's gradients of the bucket, then averages them as DDP's built-in reduction does."""
    if not isinstance(state, HookState):
        raise TypeError(
            "amp_inspect.ddp_comm_hook needs insp.comm_hook_state as its state: "
            "ddp_model.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)"
        )
    listener = state.listener
    if listener is not None:  # None after the inspector detached: only average
        listener.nonfinite_by_rank().bucket_ready(bucket, listener.step_in_progress())
    return state.average(bucket)


_STATE_ATTRIBUTE = "_amp_inspect_hook_state"


def register(ddp: nn.parallel.DistributedDataParallel, listener: HookListener) -> str | None:
    """Registers ddp_comm_hook on ``ddp`` for ``listener``, or rebinds the one an earlier ``attach``
    registered. Returns why it could not, or None."""
    state = getattr(ddp, _STATE_ATTRIBUTE, None)
    if isinstance(state, HookState):
        state.listener = listener
        return None
    if ddp_comm_hooks(ddp):
        return "this DDP model already has a comm hook"
    state = HookState(ddp, listener)
    try:
        ddp.register_comm_hook(state, ddp_comm_hook)
    except RuntimeError as error:  # a built-in hook (not listed in _comm_hooks) was registered first
        hooks = ddp_comm_hooks(ddp)
        if hooks and hooks[-1][1] is state:
            hooks.pop()  # DDP lists a hook before its reducer accepts it
        return f"DDP refused a second comm hook ({error})"
    setattr(ddp, _STATE_ATTRIBUTE, state)
    return None


def release(ddp: nn.parallel.DistributedDataParallel, listener: HookListener) -> None:
    """After ``listener`` detached, the hook it was bound to only averages (another listener's stays bound)."""
    state = getattr(ddp, _STATE_ATTRIBUTE, None)
    if isinstance(state, HookState) and state.listener is listener:
        state.listener = None


def check_attach(view: ModelView, group: dist.ProcessGroup | None, ddp_hook: bool) -> None:
    """attach()'s refusals for a DDP model: sparse gradients with the comm hook, a ``group`` other than DDP's."""
    ddp = view.ddp
    if ddp is None:
        return
    if ddp_hook and is_distributed(ddp.process_group):
        refuse_sparse_with_comm_hook(view)
    if group is not None and global_ranks(group) != global_ranks(ddp.process_group):
        raise ValueError(
            "group= differs from the DDP model's process group: the DDP hook reports over the group DDP averages "
            "over; leave group= out (or pass that group)"
        )


class DdpLink:
    """A listener's side of its DDP model: the comm hook registered at attach (``ddp_hook``), or the state for
    one registered by hand, and the per-rank NaN/Inf counts the hook makes. Either hook state is made at once,
    before any backward: its exact averaging watches every accumulation. Holds no reference to the listener."""

    def __init__(self, view: ModelView, listener: HookListener, ddp_hook: bool) -> None:
        self.view = view
        self._listener = weakref.ref(listener)  # for close(): the hook is released only from this listener
        self.counts: NonfiniteByRank | None = None  # made on the hook's first bucket
        self._manual: HookState | None = None  # the state for a hook registered by hand
        ddp = view.ddp
        if ddp is None or not is_distributed(ddp.process_group):
            return
        if not ddp_hook:
            self._manual = HookState(ddp, listener)
        elif why_not := register(ddp, listener):
            warnings.warn(
                f"amp_inspect: {why_not}, so NaN/Inf cannot be traced to the rank that produced them (reports "
                "cover the averaged gradients only)",
                RuntimeWarning,
                stacklevel=5,  # the caller of attach()
            )

    def nonfinite_by_rank(self, entries: list[ParamEntry], timeout_s: float) -> NonfiniteByRank:
        """Where the hook counts (made on first use, for ``entries``: the hook may be registered by hand)."""
        if self.counts is None:
            self.counts = NonfiniteByRank(self._ddp(), entries, timeout_s)
        return self.counts

    def hook_state(self, listener: HookListener) -> HookState:
        """The state to register ddp_comm_hook with by hand."""
        refuse_sparse_with_comm_hook(self.view)
        if self._manual is None:
            self._manual = HookState(self._ddp(), listener)
        return self._manual

    # The Probe protocol (probes/probe.py): each report's rank origin; at close, the hook only averages.

    def annotate(self, report: Any) -> dict[str, Any]:
        """``report``'s part: its step's NaN/Inf counts from before the all-reduce, when the hook made them."""
        origin = self.origin(report.step)
        return {} if origin is None else {"rank_origin": origin}

    def end_step(self, next_step: int, report: Any, optimizer_done: bool = False) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """The comm hook of this link's listener only averages from now on (DDP cannot unregister one)."""
        listener = self._listener()
        if listener is not None:
            self.release(listener)

    def origin(self, step: int) -> RankOrigin | None:
        """Step ``step``'s NaN/Inf counts from before the all-reduce, when the hook made them (None otherwise):
        what the step's report holds as its rank origin (kind BEFORE_ALLREDUCE)."""
        counts = self.counts.take(step) if self.counts is not None else None
        if counts is None:
            return None
        assert self.counts is not None
        return RankOrigin(counts, self.counts.modules, self.counts.ranks, BEFORE_ALLREDUCE)

    def release(self, listener: HookListener) -> None:
        """DDP cannot unregister a comm hook: from now on it only averages (detach on every rank alike)."""
        ddp = self.view.ddp
        if ddp is not None:
            release(ddp, listener)
            if self._manual is not None:
                self._manual.listener = None

    def _ddp(self) -> nn.parallel.DistributedDataParallel:
        ddp = self.view.ddp
        if ddp is None:
            raise RuntimeError(
                "amp_inspect.ddp_comm_hook: attach the inspector to the DistributedDataParallel model itself "
                "(attach(ddp_model)), so that the hook averages over DDP's process group"
            )
        return ddp
