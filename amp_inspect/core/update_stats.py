"""``amp_inspect.update_stats``, the Python face of the update_stats op: what ``optimizer.step()`` did to each
parameter, in one fused pass over the parameter before the step, after it, its gradient and (for Adam-family
optimizers) its second moment.

Terms (core/statistics.py ``UPDATE`` defines each statistic; ``UpdateTensorStats``' docstring lists them): an element
is **with grad** when its gradient is finite and nonzero; its update is **lost** when it is with grad and its
weight did not change (after == before as values: the step was rounded away in the weight's dtype, as bf16
weights near 1 round away any update below 2^-9); **state underflow** counts with-grad elements whose
``exp_avg_sq`` is zero or a subnormal of its dtype (Adam's step is then m / eps). The **update ratio** is
||after - before|| / ||before|| over the finite elements.

Cost: where a compiled kernel serves the device, one read of before, after, grad (and exp_avg_sq) per tensor,
no temporaries but contiguous copies of non-contiguous inputs, and no host sync. The CPU kernel's element loop is
scalar: about 4-5 ns per element on one thread (4Mi elements with state, bf16 or fp32, CPU time on a shared
2-core machine), 6-10x a ``torch._foreach_norm`` read of the same four inputs and 10-19x faster than the
reference. Elsewhere the pure-torch
reference (core/references/update_stats.py) gives the same outputs in about 15 torch ops per tensor, without a host
sync.

The module is ``updates``, not ``update_stats``, so that ``amp_inspect.update_stats`` is the function whatever was
imported first (importing a submodule of that name would replace it on the package, as for ``doctor``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from amp_inspect.core.ops import refuse_nested, update_stats_op
from amp_inspect.core.statistics import UPDATE, UPDATE_DERIVED, UPDATE_OUTPUTS, derive_update

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class UpdateTensorStats:
    """What one optimizer step did to T parameter tensors, as tensors on the inputs' device (building it never
    syncs the host); each field is [T]:"""

    numel: torch.Tensor
    with_grad: torch.Tensor
    lost: torch.Tensor
    changed: torch.Tensor
    weight_nonfinite: torch.Tensor
    weight_subnormal: torch.Tensor
    state_underflow: torch.Tensor
    made_nonfinite: torch.Tensor
    sq_change: torch.Tensor
    sq_weight: torch.Tensor
    amax: torch.Tensor

    @property
    def update_ratio(self) -> torch.Tensor:
        """sqrt(sq_change / sq_weight), float64 [T] (NaN where sq_weight is 0)."""
        return derive_update("update_ratio", self.as_dict())

    @property
    def lost_fraction(self) -> torch.Tensor:
        """lost / with_grad, float64 [T] (NaN where with_grad is 0)."""
        return derive_update("lost_fraction", self.as_dict())

    def __len__(self) -> int:
        return self.amax.shape[0]

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The statistics by name, in schema order (derived values not included)."""
        return {s.name: getattr(self, s.name) for s in UPDATE}

    @classmethod
    def from_op_outputs(cls, outputs: Sequence[torch.Tensor]) -> UpdateTensorStats:
        """The statistics of the op's (counts, sums, amax), as views of them (columns by the schema)."""
        values: dict[str, torch.Tensor] = {}
        for output, tensor in zip(UPDATE_OUTPUTS, outputs, strict=True):
            if output.one_dimensional:
                values[output.statistics[0].name] = tensor
                continue
            values.update(zip((s.name for s in output.statistics), tensor.unbind(1), strict=True))
        return cls(**values)

    def outputs(self) -> tuple[torch.Tensor, ...]:
        """The op's outputs (counts, sums, amax) holding these statistics (the inverse of ``from_op_outputs``)."""
        return tuple(
            getattr(self, o.statistics[0].name)
            if o.one_dimensional
            else torch.stack([getattr(self, s.name) for s in o.statistics], 1)
            for o in UPDATE_OUTPUTS
        )

    def merge(self, other: UpdateTensorStats) -> UpdateTensorStats:
        """The statistics of the union of the elements behind ``self`` and ``other``, row by row (the same T
        tensors' disjoint pieces, e.g. two ranks' shards), each by its merge (sums add, ``amax`` the max)."""
        if len(other) != len(self):
            raise ValueError(f"cannot merge update statistics of {len(self)} tensors with {len(other)} tensors")
        return UpdateTensorStats(
            **{s.name: getattr(torch, s.ufunc)(getattr(self, s.name), getattr(other, s.name)) for s in UPDATE}
        )

    def select(self, rows: Sequence[int] | slice) -> UpdateTensorStats:
        """The statistics of some of the tensors (``rows``: their positions, or a slice), e.g. one module's."""
        device = self.amax.device
        index = rows if isinstance(rows, slice) else torch.as_tensor(list(rows), dtype=torch.long, device=device)
        return UpdateTensorStats(**{s.name: getattr(self, s.name)[index] for s in UPDATE})

    def total(self) -> UpdateTensorStats:
        """The T tensors as one (e.g. a module's parameters): one row, each statistic merged by its merge."""
        merged = {}
        for s in UPDATE:
            value = getattr(self, s.name)
            if s.ufunc == "add":
                merged[s.name] = value.sum(0, keepdim=True)
            else:  # an empty selection has the merge's identity, the schema's empty value
                merged[s.name] = torch.cat([value, value.new_full((1,), s.empty)]).amax(0, keepdim=True)
        return UpdateTensorStats(**merged)


UpdateTensorStats.__doc__ = (
    (UpdateTensorStats.__doc__ or "")
    + "\n\n"
    + "\n".join(
        [f"    - ``{s.name}`` ({s.dtype}, merged by {s.merge}): {s.doc}." for s in UPDATE]
        + [f"    - ``{d.name}`` (from {', '.join(d.needs)}): {d.doc}." for d in UPDATE_DERIVED]
    )
)

# The dataclass's fields are the schema's statistics, in its order (tests/test_update_stats.py holds them equal).


def _tensor_list(name: str, tensors: object) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{name} must be a list of tensors; wrap a single tensor as [t]")
    try:
        items = list(tensors)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{name} must be a list of tensors, not {type(tensors).__name__}") from None
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] is a {type(t).__name__}, not a tensor")
        refuse_nested("update_stats", f"{name}[{i}]", t)
        if t.dtype not in INPUT_DTYPES:
            raise TypeError(f"{name}[{i}] is {t.dtype}; update_stats takes float32, bfloat16 or float16 tensors")
        if t.layout != torch.strided:
            raise TypeError(f"{name}[{i}] is a {t.layout} tensor; update_stats takes dense tensors")
    return items


def check_update_inputs(
    before: object, after: object, grads: object, exp_avg_sq: object = None
) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """The op's inputs, checked (one sentence for what is wrong), detached and contiguous."""
    b, a, g = _tensor_list("before", before), _tensor_list("after", after), _tensor_list("grads", grads)
    s = [] if exp_avg_sq is None else _tensor_list("exp_avg_sq", exp_avg_sq)
    if not len(b) == len(a) == len(g) or len(s) not in (0, len(b)):
        raise ValueError(
            f"before, after and grads must hold one tensor per parameter each (and exp_avg_sq none or as many), got "
            f"{len(b)}, {len(a)}, {len(g)} and {len(s)}"
        )
    for i in range(len(b)):
        if a[i].dtype != b[i].dtype:
            raise TypeError(f"after[{i}] is {a[i].dtype} and before[{i}] {b[i].dtype}; a step keeps the dtype")
        for name, t in (("after", a[i]), ("grads", g[i])) + ((("exp_avg_sq", s[i]),) if s else ()):
            if t.shape != b[i].shape:
                raise ValueError(f"{name}[{i}] has shape {list(t.shape)} and before[{i}] {list(b[i].shape)}")
    devices = {t.device for t in (*b, *a, *g, *s)}
    if len(devices) > 1:
        raise ValueError(f"update_stats takes tensors on one device, got {', '.join(sorted(map(str, devices)))}")
    return tuple([t.detach().contiguous() for t in ts] for ts in (b, a, g, s))  # type: ignore[return-value]


def update_stats(
    before: Sequence[torch.Tensor],
    after: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    exp_avg_sq: Sequence[torch.Tensor] | None = None,
) -> UpdateTensorStats:
    """What the step from ``before`` to ``after`` did to each parameter tensor, given the gradients the optimizer
    saw (``grads``) and, for Adam, its second moments (``exp_avg_sq``; None: no state, ``state_underflow`` 0).
    Tensors float32 / bfloat16 / float16 on one device; ``after[i]`` of ``before[i]``'s shape and dtype,
    ``grads[i]`` and ``exp_avg_sq[i]`` of its shape. See the module docstring for the terms and the cost; no host
    sync."""
    outputs = update_stats_op(*check_update_inputs(before, after, grads, exp_avg_sq))
    return UpdateTensorStats.from_op_outputs(outputs)
