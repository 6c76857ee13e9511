"""``amp_inspect.format_readiness``: what each low-precision GEMM recipe (FP8 per tensor or per 1x128 block, MXFP8,
MXFP4, NVFP4; core/recipes.py) would lose on each tensor, for every recipe at once, in one fused pass.

Terms (x is an element, widened exactly to float32; the rules that give its scaled value v, its cast q and its
dequantized value are core/recipes.py's): an element is **flushed** when it is finite and nonzero and its
dequantized value is 0; **saturated** when it is finite and |v| exceeds the element format's largest finite value
(the cast clamps it there, as the hardware's saturating casts do); its **error** is x minus its dequantized value.
NaN and Inf elements are counted (``nonfinite``) and left out of every amax and sum: the question is what the
finite values would lose (a real cast would also spoil the block the NaN is in). Blocks run along the last
dimension as the tensor is given; a row's last block may be shorter. Each statistic is an entry of the schema
(core/statistics.py ``READINESS``, ``READINESS_DERIVED``); ``ReadinessStats``'s docstring lists them.

Cost: on the CPU one read of every element (all recipes judge a 128-element block while it is in L1), plus a
first read for the tensor amax when a tensor-scaled recipe (``fp8_*_tensor``, ``nvfp4``) is asked for and no
``tensor_amax`` is given; no temporary grows with the tensors but contiguous copies of non-contiguous ones; no
host sync where a compiled kernel serves the device. Elsewhere the float64 reference
(core/references/format_readiness.py) gives the same outputs, in several passes, and syncs the host.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from amp_inspect.core.ops import format_readiness_op, refuse_nested
from amp_inspect.core.recipes import RECIPE_NAMES, check_recipes
from amp_inspect.core.statistics import (
    PER_TENSOR,
    READINESS,
    READINESS_DERIVED,
    READINESS_OUTPUTS,
    derive_readiness,
    output_column,
)

INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@functools.cache
def _column_plan(num_recipes: int) -> tuple[tuple[int, str, int | None, int], ...]:
    """Where each statistic sits in the op's outputs for ``num_recipes`` recipes, as ReadinessStats.from_op_outputs
    slices them: (output index, statistic, first column, step). First column None: a one-dimensional output; step 0:
    a per-tensor statistic, one column repeated across the recipes. Worked out from the schema once per recipe count
    (a readiness step calls from_op_outputs for every operand of every module: the schema's lookups were most of
    its cost)."""
    plan: list[tuple[int, str, int | None, int]] = []
    for k, output in enumerate(READINESS_OUTPUTS):
        if output.one_dimensional:
            plan.append((k, output.statistics[0].name, None, 0))
            continue
        for s in output.statistics:
            first = output_column(output, s.name, 0, num_recipes)
            if s.per == PER_TENSOR:
                plan.append((k, s.name, first, 0))
            else:
                step = output_column(output, s.name, 1, num_recipes) - first if num_recipes > 1 else 1
                plan.append((k, s.name, first, step))
    return tuple(plan)


@dataclass(frozen=True)
class ReadinessStats:
    """Format readiness of T tensors for R recipes, as tensors on the inputs' device (building it never syncs the
    host). ``recipes``: the recipe names, in the order of the columns; ``delayed``: the tensor-scaled recipes used
    a given ``tensor_amax`` (delayed scaling) rather than the amax measured. Per-tensor counts and ``sq_signal`` are
    repeated across the recipe columns, so that every field but ``amax`` is [T, R]:"""

    recipes: tuple[str, ...]
    numel: torch.Tensor
    nonzero: torch.Tensor
    nonfinite: torch.Tensor
    flushed: torch.Tensor
    saturated: torch.Tensor
    blocks: torch.Tensor
    scale_flushed: torch.Tensor
    sq_signal: torch.Tensor
    sq_error: torch.Tensor
    amax: torch.Tensor
    delayed: bool = False

    @property
    def sqnr_db(self) -> torch.Tensor:
        """10 log10(sq_signal / sq_error), float64 [T, R]: +inf where nothing was lost, NaN where no element is
        finite and nonzero."""
        return derive_readiness("sqnr_db", self._statistics())

    @property
    def flushed_fraction(self) -> torch.Tensor:
        """flushed / nonzero, float64 [T, R] (NaN where nonzero is 0)."""
        return derive_readiness("flushed_fraction", self._statistics())

    @property
    def saturated_fraction(self) -> torch.Tensor:
        """saturated / nonzero, float64 [T, R] (NaN where nonzero is 0)."""
        return derive_readiness("saturated_fraction", self._statistics())

    def _statistics(self) -> dict[str, torch.Tensor]:
        return {s.name: getattr(self, s.name) for s in READINESS}

    def __len__(self) -> int:
        return self.amax.shape[0]

    def column(self, recipe: str) -> int:
        """The column that holds ``recipe``."""
        try:
            return self.recipes.index(recipe)
        except ValueError:
            raise KeyError(f"recipe {recipe!r} was not asked for; these were: {', '.join(self.recipes)}") from None

    @classmethod
    def from_op_outputs(
        cls, outputs: Sequence[torch.Tensor], recipes: Sequence[str], *, delayed: bool = False
    ) -> ReadinessStats:
        """The statistics of the op's (counts, sums, amax), as views of them (columns by the schema)."""
        r = len(recipes)
        if len(outputs) != len(READINESS_OUTPUTS):
            raise ValueError(f"format_readiness has {len(READINESS_OUTPUTS)} outputs, not {len(outputs)}")
        values: dict[str, torch.Tensor] = {}
        for k, name, first, step in _column_plan(r):
            tensor = outputs[k]
            if first is None:
                values[name] = tensor
            elif step == 0:
                values[name] = tensor[:, first].unsqueeze(1).expand(tensor.shape[0], r)
            else:
                values[name] = tensor[:, first : first + step * r : step]
        return cls(tuple(recipes), delayed=delayed, **values)

    def outputs(self) -> tuple[torch.Tensor, ...]:
        """The op's outputs (counts, sums, amax) holding these statistics (the inverse of ``from_op_outputs``)."""
        made = []
        for output in READINESS_OUTPUTS:
            if output.one_dimensional:
                made.append(getattr(self, output.statistics[0].name))
                continue
            single = [getattr(self, s.name)[:, 0] for s in output.statistics if s.per == PER_TENSOR]
            many = [getattr(self, s.name) for s in output.statistics if s.per != PER_TENSOR]
            rows = len(self)
            columns = [torch.stack(single, 1)] if single else []
            if many:  # recipe by recipe (Output.recipe_major)
                columns.append(torch.stack(many, 2).reshape(rows, -1))
            made.append(torch.cat(columns, 1))
        return tuple(made)

    def merge(self, other: ReadinessStats) -> ReadinessStats:
        """The statistics of the union of the elements behind ``self`` and ``other``, row by row (the same T tensors'
        disjoint pieces: two micro-batches, two steps, two ranks' shards), each statistic by its merge (sums add,
        ``amax`` takes the max). On the device, no host sync."""
        if other.recipes != self.recipes or len(other) != len(self):
            raise ValueError(
                f"cannot merge readiness of {len(self)} tensors and recipes {self.recipes} with {len(other)} tensors "
                f"and recipes {other.recipes}"
            )
        merged = {s.name: getattr(torch, s.ufunc)(getattr(self, s.name), getattr(other, s.name)) for s in READINESS}
        return ReadinessStats(self.recipes, delayed=self.delayed or other.delayed, **merged)

    def select(self, rows: Sequence[int] | slice) -> ReadinessStats:
        """The statistics of some of the tensors (``rows``: their positions, or a slice), e.g. one module's."""
        device = self.amax.device
        index = rows if isinstance(rows, slice) else torch.as_tensor(list(rows), dtype=torch.long, device=device)
        picked = {s.name: getattr(self, s.name)[index] for s in READINESS}
        return ReadinessStats(self.recipes, delayed=self.delayed, **picked)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The statistics by name, in schema order (derived values not included)."""
        return self._statistics()

    def total(self) -> ReadinessStats:
        """The T tensors as one (e.g. a module's operand split over several tensors): one row, each statistic merged
        over the rows by its merge."""
        merged = {}
        for s in READINESS:
            value = getattr(self, s.name)
            merged[s.name] = value.sum(0, keepdim=True) if s.ufunc == "add" else value.amax(0, keepdim=True)
        return ReadinessStats(self.recipes, delayed=self.delayed, **merged)


ReadinessStats.__doc__ = (
    (ReadinessStats.__doc__ or "")
    + "\n\n"
    + "\n".join(
        [
            f"    - ``{s.name}`` ({s.dtype} {'[T]' if s.name == 'amax' else '[T, R]'}, merged by {s.merge}): {s.doc}."
            for s in READINESS
        ]
        + [f"    - ``{d.name}`` (from {', '.join(d.needs)}): {d.doc}." for d in READINESS_DERIVED]
    )
)

# The dataclass's fields are the schema's statistics, in its order (tests/test_schema.py holds them equal): a new
# statistic is its schema entry and one field line above.


def _check_tensors(tensors: object) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError("tensors must be a list of tensors; wrap a single tensor as [t]")
    try:
        items = list(tensors)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"tensors must be a list of tensors, not {type(tensors).__name__}") from None
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] is a {type(t).__name__}, not a tensor")
        refuse_nested("format_readiness", f"tensors[{i}]", t)
        if t.dtype not in INPUT_DTYPES:
            raise TypeError(
                f"tensors[{i}] is {t.dtype}; format readiness takes float32, bfloat16 or float16 tensors (the dtypes "
                "a GEMM operand is cast from)"
            )
        if t.layout != torch.strided:
            raise TypeError(f"tensors[{i}] is a {t.layout} tensor; format readiness takes dense tensors")
        if t.device != items[0].device:
            raise ValueError(f"tensors[{i}] is on {t.device} and tensors[0] on {items[0].device}; use one device")
    return [t.detach() for t in items]


def _capturing_on(device: torch.device) -> bool:
    """Whether the current stream of ``device`` (the tensors' GPU, which need not be the current device) is being
    captured into a CUDA graph: the copy of a list would be issued there."""
    with torch.cuda.device(device):
        return torch.cuda.is_current_stream_capturing()


def _check_tensor_amax(tensor_amax: object, tensors: list[torch.Tensor]) -> torch.Tensor | None:
    if tensor_amax is None:
        return None
    device = tensors[0].device if tensors else torch.device("cpu")
    if not isinstance(tensor_amax, torch.Tensor):
        if device.type == "cuda" and _capturing_on(device):
            # A list becomes a host-to-device copy from pageable memory, which a CUDA graph cannot capture.
            raise ValueError(
                "tensor_amax given as a list while a CUDA graph is being captured: pass it as a float32 CUDA tensor "
                "made before the capture (a list is copied to the GPU from pageable memory, which cannot be captured)"
            )
        try:
            tensor_amax = torch.tensor([float(a) for a in tensor_amax], dtype=torch.float32, device=device)  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            raise TypeError(
                f"tensor_amax must be a float32 tensor or a list of numbers, not {type(tensor_amax).__name__}"
            ) from None
    if tensor_amax.dtype != torch.float32 or tuple(tensor_amax.shape) != (len(tensors),):
        raise ValueError(
            f"tensor_amax must be float32 of shape [{len(tensors)}] (one amax per tensor), not {tensor_amax.dtype} "
            f"{list(tensor_amax.shape)}"
        )
    if tensor_amax.device != device:
        raise ValueError(f"tensor_amax is on {tensor_amax.device} and the tensors on {device}")
    # Read on the CPU only (elsewhere that would sync). Inf and NaN are accepted: a stale amax of those gives the
    # unit scale (core/recipes.py).
    if device.type == "cpu" and not torch.compiler.is_compiling() and bool((tensor_amax < 0).any()):
        raise ValueError(f"tensor_amax must be >= 0, got {tensor_amax.tolist()}")
    return tensor_amax.detach()


def format_readiness(
    tensors: Sequence[torch.Tensor], recipes: Sequence[str] | str | None = None, *, tensor_amax=None
) -> ReadinessStats:
    """What each recipe (names of recipes.RECIPES; None: all of them, in that order) would lose on each tensor
    (float32, bfloat16 or float16, all on one device). ``tensor_amax`` (float32 [T], or a list of numbers): the amax
    the tensor-scaled recipes use, e.g. the previous inspection's (delayed scaling, as TransformerEngine's delayed
    recipe does); without it the tensors' own finite amax is measured first. See the module docstring for the terms
    and the cost; no host sync where a compiled kernel serves the device."""
    names = check_recipes(recipes)
    items = _check_tensors(tensors)
    amax = _check_tensor_amax(tensor_amax, items)
    indices = [RECIPE_NAMES.index(n) for n in names]
    outputs = format_readiness_op(items, indices, amax)
    return ReadinessStats.from_op_outputs(outputs, names, delayed=amax is not None)
