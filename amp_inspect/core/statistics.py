"""The schema of statistics: every statistic the tensor_stats op measures is one entry here, and every view
derived from them is another. Everything that slices, allocates, merges, reduces across ranks or logs the
statistics reads this table instead of listing them: ``TensorStats`` (core/tensor_stats.py), the fake kernel
(core/ops.py), the reference's outputs (core/references/tensor_stats.py), ``reduce_stats`` (distributed/combine.py), the
per-module views and the run log's module records (gradients/step_report.py, runlog/log.py). docs/architecture.md walks
through adding a statistic.

Terms (v is the value judged: x, or ``float32(x) * scale``; the format terms are defined in core/formats.py):

- **per**: what one tensor holds: one value (``PER_TENSOR``), one per requested format (``PER_FORMAT``,
  columns in the order of ``formats``), one per float32 exponent field (``PER_BIN``, ``HIST_BINS`` columns), one
  per requested recipe (``PER_RECIPE``, format readiness's statistics: ``READINESS`` below); the optimizer
  update's statistics (``UPDATE``) are one value per parameter tensor.
- **merge**: how the statistics of disjoint sets of elements combine into the statistic of their union:
  ``SUM`` (counts and sums; a histogram adds bin by bin), ``MAX`` or ``MIN``. One rule serves every merge
  the package makes, because each is a union of disjoint elements: the chunks of one tensor (the kernels),
  the tensors of a module (gradients/step_report.py), the shards of FSDP2 ranks (distributed/combine.py), and steps.
  ``empty`` is the value of a tensor without elements, the rule's identity. ``Statistic.ufunc`` names the elementwise
  function numpy and torch share that merges two values: ``add``, ``fmax``, ``fmin`` (NaN-ignoring, as Python's ``max``
  over a running value is).
- **unscale**: the power of the loss scale a statistic of scaled values carries (amax 1, sumsq 2), which the
  report divides out; None: reported as judged (counts and histograms describe the judged values).
- **output**: the op output that holds it. The op returns ``OUTPUTS``, in the order their statistics first
  appear in ``STATISTICS``; the statistics of one output
  share dtype and merge and are its columns in order; an output of one single-valued statistic is 1-D [T].
- **derived**: computed from merged statistics (``needs``), never merged itself: a norm of a module is the
  root of the module's merged sum of squares, not a merge of norms. As TransformerEngine's debug statistics
  do (transformer_engine/debug/features/utils/stats_computation.py: (compute, reduce) pairs, derived ones
  naming their dependencies), kernels compute mergeable primitives and the rest is derived.

The C++ side has the same tables (csrc/tensor_stats/tensor_stats_call.h ``kOutputs``, tensor_stats.h ``kFormatBounds``,
``kFixedCountColumns``, ``kHistBins``) and hands them to Python through ``amp_inspect._C.layout()``;
``layout_problem`` says where the two differ, the extension is refused at load time when they do
(amp_inspect/core/_native.py), and tests/test_schema.py holds them equal.

Torch-free and numpy-free (the log readers use it); the few helpers that make tensors import torch when called.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from amp_inspect.core.formats import FORMAT_BOUNDS, HIST_BINS

if TYPE_CHECKING:
    import torch

PER_TENSOR, PER_FORMAT, PER_BIN, PER_RECIPE = "tensor", "format", "bin", "recipe"
SUM, MAX, MIN = "sum", "max", "min"
_UFUNCS = {SUM: "add", MAX: "fmax", MIN: "fmin"}
_INT_DTYPES = frozenset({"int64"})


@dataclass(frozen=True)
class Statistic:
    """One statistic the op measures (module docstring: the terms)."""

    name: str
    dtype: str  # a torch / numpy dtype name: "int64", "float32", "float64"
    per: str
    merge: str
    output: str
    empty: float
    unscale: int | None
    in_module_record: bool  # a field of each module of the run log's "modules" (report.by_module)
    doc: str
    # When a module record shows NaN ("unknown") instead of the merged value, given the module's merged values.
    unknown_when: Callable[[Mapping[str, Any]], bool] | None = None

    def columns(self, num_formats: int) -> int:
        """Its columns per tensor for ``num_formats`` formats (or recipes, for a ``PER_RECIPE`` statistic)."""
        return {PER_TENSOR: 1, PER_FORMAT: num_formats, PER_BIN: HIST_BINS, PER_RECIPE: num_formats}[self.per]

    @property
    def is_count(self) -> bool:
        return self.dtype in _INT_DTYPES

    @property
    def ufunc(self) -> str:
        """The elementwise function numpy and torch both name, that merges two values: add, fmax, fmin."""
        return _UFUNCS[self.merge]


@dataclass(frozen=True)
class Derived:
    """A value computed from merged statistics (``needs``: statistics or other derived values, listed first)."""

    name: str
    needs: tuple[str, ...]
    compute: Callable[[Mapping[str, Any]], Any]  # on tensors, numpy arrays or numbers alike
    unscale: int | None
    in_module_record: bool
    doc: str
    unknown_when: Callable[[Mapping[str, Any]], bool] | None = None


def _sqrt(x: Any) -> Any:
    """The square root of a number, tensor or numpy array, correctly rounded in each."""
    if isinstance(x, (int, float)):
        return math.sqrt(x)
    return x.sqrt() if hasattr(x, "sqrt") else x**0.5  # numpy computes a power of 0.5 as its sqrt


def _no_finite_value(v: Mapping[str, Any]) -> bool:
    return bool(v["nonfinite"]) and v["nonfinite"] >= v["numel"]


def _any_nonfinite(v: Mapping[str, Any]) -> bool:
    return bool(v["nonfinite"])


def _count(name: str, per: str, doc: str) -> Statistic:
    return Statistic(name, "int64", per, SUM, "counts", 0, None, True, doc)


STATISTICS: tuple[Statistic, ...] = (
    _count("numel", PER_TENSOR, "elements"),
    _count("nan", PER_TENSOR, "NaN elements"),
    _count("posinf", PER_TENSOR, "+Inf elements"),
    _count("neginf", PER_TENSOR, "-Inf elements"),
    _count("zero", PER_TENSOR, "elements equal to zero (either sign)"),
    _count("overflow", PER_FORMAT, "finite v whose cast to the format is +-Inf (core/formats.py)"),
    _count("subnormal", PER_FORMAT, "finite nonzero v whose cast is a nonzero subnormal of the format"),
    _count("underflow", PER_FORMAT, "finite nonzero v whose cast is zero"),
    Statistic(
        "hist", "int64", PER_BIN, SUM, "hist", 0, None, False,
        "elements by the float32 exponent field of v, (bits >> 23) & 0xFF: bin 0 zeros and float32 subnormals, "
        "bin 255 Inf and NaN, bin 127 [1, 2); each row sums to numel; a float64 v is binned as float32(v)",
    ),
    Statistic(
        "amax", "float32", PER_TENSOR, MAX, "amax", 0.0, 1, True,
        "max |v| over finite v (0 when there is none); a float64 extreme is rounded to float32",
        unknown_when=_no_finite_value,
    ),
    Statistic(
        "amin_nonzero", "float32", PER_TENSOR, MIN, "amin_nonzero", math.inf, 1, False,
        "min |v| over finite nonzero v (+inf when there is none); a float64 extreme is rounded to float32",
    ),
    Statistic(
        "sumsq", "float64", PER_TENSOR, SUM, "sumsq", 0.0, 2, False,
        "sum of v*v over finite v, relative error below 2e-6 against a float64 sum (float32 partial sums of at "
        "most 16 terms, accumulated in float64)",
    ),
)  # fmt: skip

DERIVED: tuple[Derived, ...] = (
    Derived(
        "nonfinite", ("nan", "posinf", "neginf"), lambda v: v["nan"] + v["posinf"] + v["neginf"], None, False,
        "NaN + Inf elements",
    ),
    Derived("norm", ("sumsq",), lambda v: _sqrt(v["sumsq"]), 1, False, "L2 norm of the finite values"),
    Derived(
        "grad_norm", ("sumsq", "nonfinite"), lambda v: _sqrt(v["sumsq"]), 1, True,
        "a module's L2 norm, unknown (NaN) when any of its values is NaN/Inf: a norm of the finite rest would read "
        "as a measurement",
        unknown_when=_any_nonfinite,
    ),
)  # fmt: skip

BY_NAME: dict[str, Statistic] = {s.name: s for s in STATISTICS}
DERIVED_BY_NAME: dict[str, Derived] = {d.name: d for d in DERIVED}


@dataclass(frozen=True)
class Output:
    """One output of the op: its statistics side by side (module docstring)."""

    name: str
    statistics: tuple[Statistic, ...]
    # Per-recipe columns recipe by recipe (format readiness's counts: flushed, saturated, blocks, scale_flushed of
    # the first recipe, then of the second, ...), after the single-valued statistics; else statistic by statistic.
    recipe_major: bool = False

    @property
    def dtype(self) -> str:
        return self.statistics[0].dtype

    @property
    def merge(self) -> str:
        return self.statistics[0].merge

    @property
    def one_dimensional(self) -> bool:
        return len(self.statistics) == 1 and self.statistics[0].per == PER_TENSOR

    def columns(self, num_formats: int) -> int:
        return sum(s.columns(num_formats) for s in self.statistics)

    def shape(self, rows: int, num_formats: int) -> tuple[int, ...]:
        return (rows,) if self.one_dimensional else (rows, self.columns(num_formats))

    def runs(self) -> Iterator[tuple[Statistic, ...]]:
        """Its statistics in column order, neighbouring single-valued ones together (one slice holds them all,
        split apart with one unbind: TensorStats takes and rebuilds an output in a number of torch ops that does
        not depend on the number of formats, which the fallback's op count needs)."""
        run: list[Statistic] = []
        for s in self.statistics:
            if s.per == PER_TENSOR:
                run.append(s)
                continue
            if run:
                yield tuple(run)
                run = []
            yield (s,)
        if run:
            yield tuple(run)


def _outputs(table: Sequence[Statistic], derived: Sequence[Derived]) -> tuple[Output, ...]:
    """The outputs of an op whose statistics are ``table`` (in output order), with the schema's rules checked."""
    names = list(dict.fromkeys(s.output for s in table))
    outputs = []
    for n in names:
        members = tuple(s for s in table if s.output == n)
        recipe_major = any(s.per == PER_RECIPE for s in members)
        outputs.append(Output(n, members, recipe_major))
        if recipe_major and [s.per for s in members] != sorted((s.per for s in members), key=lambda p: p != PER_TENSOR):
            raise AssertionError(f"output {n!r}'s single-valued statistics do not come first")
    for o in outputs:  # the schema's own rules, checked once at import
        if len({s.dtype for s in o.statistics}) != 1 or len({s.merge for s in o.statistics}) != 1:
            raise AssertionError(f"the statistics of output {o.name!r} differ in dtype or merge")
        if list(o.statistics) != [s for s in table if s.output == o.name] or len(names) != len(set(names)):
            raise AssertionError(f"output {o.name!r}'s statistics are not neighbours in their table")
    for d in derived:
        known = {s.name for s in table} | {e.name for e in derived[: list(derived).index(d)]}
        if not set(d.needs) <= known:
            raise AssertionError(f"derived {d.name!r} needs {sorted(set(d.needs) - known)}, not defined before it")
    return tuple(outputs)


OUTPUTS: tuple[Output, ...] = _outputs(STATISTICS, DERIVED)
OUTPUT_NAMES: tuple[str, ...] = tuple(o.name for o in OUTPUTS)
# The run log's module fields by kind (runlog/log.py checks their types when it reads a log).
MODULE_COUNT_FIELDS: tuple[str, ...] = tuple(s.name for s in STATISTICS if s.in_module_record and s.is_count)
FLOAT_FIELDS: frozenset[str] = frozenset(
    [s.name for s in STATISTICS if not s.is_count] + [d.name for d in DERIVED if d.in_module_record]
)


def record_key(name: str, column: int, formats: Sequence[str]) -> str:
    """A per-format field's key in a module record: the name for the first format, ``name/format`` else."""
    return name if column == 0 else f"{name}/{formats[column]}"


def module_record_fields(formats: Sequence[str]) -> list[tuple[str, Statistic | Derived, int]]:
    """(key, entry, column) of each field of a module record, in the record's order: statistics in schema
    order, each run of per-format ones written format by format (overflow, subnormal, underflow, then
    overflow/bf16, ...), then the derived fields."""
    fields: list[tuple[str, Statistic | Derived, int]] = []
    recorded = [s for s in STATISTICS if s.in_module_record]
    i = 0
    while i < len(recorded):
        if recorded[i].per != PER_FORMAT:
            fields.append((recorded[i].name, recorded[i], 0))
            i += 1
            continue
        j = i
        while j < len(recorded) and recorded[j].per == PER_FORMAT:
            j += 1
        fields += [(record_key(s.name, f, formats), s, f) for f in range(len(formats)) for s in recorded[i:j]]
        i = j
    fields += [(d.name, d, 0) for d in DERIVED if d.in_module_record]
    return fields


def derive(name: str, values: Mapping[str, Any]) -> Any:
    """Derived value ``name`` of ``values`` (merged statistics by name: tensors, arrays or numbers), computing
    only what it needs."""
    return derive_from(DERIVED_BY_NAME, name, values)


def derive_from(table: Mapping[str, Derived], name: str, values: Mapping[str, Any]) -> Any:
    """Derived value ``name`` of one table of derived values (``DERIVED_BY_NAME``, or a second op's), from merged
    statistics ``values`` by name; what it needs and is not in ``values`` is derived first, from the same table."""
    d = table[name]
    return d.compute({n: values[n] if n in values else derive_from(table, n, values) for n in d.needs})


def new_outputs(rows: int, formats: Sequence[str], device: Any, *, filled: bool) -> tuple[torch.Tensor, ...]:
    """The op's outputs for ``rows`` tensors: each statistic's ``empty`` value (``filled``) or uninitialised
    (the fake kernel's). Imports torch."""
    import torch

    made = []
    for o in OUTPUTS:
        shape, dtype = o.shape(rows, len(formats)), getattr(torch, o.dtype)
        if not filled:
            made.append(torch.empty(shape, dtype=dtype, device=device))
            continue
        values = [
            torch.full((rows, s.columns(len(formats))), s.empty, dtype=dtype, device=device) for s in o.statistics
        ]
        made.append(torch.cat(values, 1).view(shape) if len(values) > 1 else values[0].view(shape))
    return tuple(made)


# ---------------------------------------------------------------------------------------------- format readiness
# The statistics of the format_readiness op (core/format_readiness.py; the recipes and their rules: core/recipes.py), a
# second table of the same schema: per tensor, or per recipe asked for (columns in the order of ``recipes``). The op's
# counts and sums hold their per-recipe columns recipe by recipe (``Output.recipe_major``).


def _readiness_count(name: str, per: str, doc: str) -> Statistic:
    return Statistic(name, "int64", per, SUM, "counts", 0, None, False, doc)


READINESS: tuple[Statistic, ...] = (
    _readiness_count("numel", PER_TENSOR, "elements"),
    _readiness_count("nonzero", PER_TENSOR, "finite nonzero elements"),
    _readiness_count("nonfinite", PER_TENSOR, "NaN and Inf elements, left out of every amax, count but numel and sum"),
    _readiness_count("flushed", PER_RECIPE, "finite nonzero x whose quantized-then-dequantized value is 0"),
    _readiness_count(
        "saturated", PER_RECIPE,
        "finite x whose scaled value |v| exceeds the element format's largest finite value (every recipe's cast "
        "saturates: such a v becomes that value with its sign, never Inf or NaN)",
    ),
    _readiness_count("blocks", PER_RECIPE, "blocks (scales) of the tensor: 1 for a tensor-scaled recipe, 0 when empty"),
    _readiness_count(
        "scale_flushed", PER_RECIPE,
        "blocks whose scale is at its limit: an fp32 scale overflowed to FLT_MAX, an E8M0 exponent clamped to "
        "[-127, 127], an NVFP4 E4M3 block scale zero or subnormal",
    ),
    Statistic("sq_signal", "float64", PER_TENSOR, SUM, "sums", 0.0, None, False, "sum of x^2 over finite x, float64"),
    Statistic(
        "sq_error", "float64", PER_RECIPE, SUM, "sums", 0.0, None, False,
        "sum over finite x of (x - dequant(quant(x)))^2, float64 (the kernels agree with the float64 reference to "
        "a relative 1e-12: only the order of the sum and the rounding of q / s differ)",
    ),
    Statistic(
        "amax", "float32", PER_TENSOR, MAX, "amax", 0.0, None, False,
        "the tensor amax the tensor-scaled recipes used: the one given (delayed scaling) or the finite amax "
        "measured (0 when there is no finite element)",
    ),
)  # fmt: skip


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float))


def _fraction(part: Any, whole: Any) -> Any:
    """part / whole as float64 (NaN where whole is 0), on numbers, tensors or numpy arrays."""
    if _is_number(part) and _is_number(whole):
        return part / whole if whole else math.nan
    if hasattr(part, "double"):  # torch: an int64 quotient would be float32
        return part.double() / whole
    import numpy as np

    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(part, dtype=np.float64) / whole


def _sqnr_db(v: Mapping[str, Any]) -> Any:
    """10 log10(sq_signal / sq_error): +inf where nothing was lost, NaN where no element is finite and nonzero."""
    signal, error, nonzero = v["sq_signal"], v["sq_error"], v["nonzero"]
    if _is_number(signal) and _is_number(error):
        if not nonzero:
            return math.nan
        return math.inf if error == 0 else 10.0 * math.log10(signal / error)
    if hasattr(signal, "log10"):  # torch; a signal of no nonzero element is 0, and 0 / 0 is NaN
        return 10.0 * (signal / error).log10().where(nonzero != 0, math.nan)
    import numpy as np

    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.asarray(nonzero) != 0, 10.0 * np.log10(np.asarray(signal) / error), np.nan)


READINESS_DERIVED: tuple[Derived, ...] = (
    Derived(
        "sqnr_db", ("sq_signal", "sq_error", "nonzero"), _sqnr_db, None, False,
        "signal to quantization noise, 10 log10(sq_signal / sq_error) in dB: +inf where nothing was lost, NaN where "
        "no element is finite and nonzero",
    ),
    Derived(
        "flushed_fraction", ("flushed", "nonzero"), lambda v: _fraction(v["flushed"], v["nonzero"]), None, False,
        "flushed / nonzero (NaN where nonzero is 0)",
    ),
    Derived(
        "saturated_fraction", ("saturated", "nonzero"), lambda v: _fraction(v["saturated"], v["nonzero"]), None,
        False, "saturated / nonzero (NaN where nonzero is 0)",
    ),
)  # fmt: skip

READINESS_BY_NAME: dict[str, Statistic] = {s.name: s for s in READINESS}
READINESS_DERIVED_BY_NAME: dict[str, Derived] = {d.name: d for d in READINESS_DERIVED}
READINESS_OUTPUTS: tuple[Output, ...] = _outputs(READINESS, READINESS_DERIVED)
READINESS_OUTPUT_NAMES: tuple[str, ...] = tuple(o.name for o in READINESS_OUTPUTS)


def derive_readiness(name: str, values: Mapping[str, Any]) -> Any:
    """Derived readiness value ``name`` of merged readiness statistics ``values`` (by name)."""
    return derive_from(READINESS_DERIVED_BY_NAME, name, values)


def output_column(output: Output, statistic: str, position: int, num: int) -> int:
    """The column of ``output`` holding ``statistic`` for format / recipe number ``position`` of ``num`` (0 for a
    single-valued statistic)."""
    single = [s for s in output.statistics if s.per == PER_TENSOR]
    names = [s.name for s in output.statistics]
    if statistic not in names:
        raise KeyError(f"output {output.name!r} holds no statistic {statistic!r}")
    if output.recipe_major:
        if statistic in (s.name for s in single):
            return [s.name for s in single].index(statistic)
        many = [s.name for s in output.statistics if s.per != PER_TENSOR]
        return len(single) + len(many) * position + many.index(statistic)
    before = output.statistics[: names.index(statistic)]
    return sum(s.columns(num) for s in before) + position


def new_readiness_outputs(rows: int, num_recipes: int, device: Any) -> tuple[torch.Tensor, ...]:
    """The format_readiness op's outputs for ``rows`` tensors, uninitialised (the fake kernel's). Imports torch."""
    import torch

    return tuple(
        torch.empty(o.shape(rows, num_recipes), dtype=getattr(torch, o.dtype), device=device) for o in READINESS_OUTPUTS
    )


# ---------------------------------------------------------------------------------------------- optimizer updates
# The statistics of the update_stats op (update_stats.py): what optimizer.step() did to each parameter, from the
# parameter before the step (``before``), after it (``after``), its gradient and optionally Adam's second moment
# (``exp_avg_sq``), one row per parameter tensor. A gradient element is **with grad** when it is finite and nonzero;
# an update is **lost** when such an element's weight did not change (after == before as values, so +0 and -0 are
# equal: the update was rounded away in the weight's dtype); **state underflow** counts with-grad elements whose
# exp_avg_sq is zero or a subnormal of its own dtype (Adam then divides by eps alone).


def _update_count(name: str, doc: str) -> Statistic:
    return Statistic(name, "int64", PER_TENSOR, SUM, "counts", 0, None, False, doc)


UPDATE: tuple[Statistic, ...] = (
    _update_count("numel", "elements"),
    _update_count("with_grad", "elements whose gradient is finite and nonzero"),
    _update_count(
        "lost", "with-grad elements whose weight did not change (after == before as values: +0 equals -0)"
    ),
    _update_count("changed", "elements whose weight changed (after != before; NaN counts as changed)"),
    _update_count("weight_nonfinite", "elements whose weight after the step is NaN or Inf"),
    _update_count("weight_subnormal", "elements whose weight after the step is a nonzero subnormal of its dtype"),
    _update_count(
        "state_underflow",
        "with-grad elements whose exp_avg_sq is zero or a subnormal of its dtype (0 when no state is given)",
    ),
    _update_count(
        "made_nonfinite",
        "elements whose weight and gradient were finite before the step and whose weight is NaN or Inf after it: "
        "the step itself made them non-finite",
    ),
    Statistic(
        "sq_change", "float64", PER_TENSOR, SUM, "sums", 0.0, None, False,
        "sum of (after - before)^2 over elements with finite before and after, the difference in float64",
    ),
    Statistic(
        "sq_weight", "float64", PER_TENSOR, SUM, "sums", 0.0, None, False,
        "sum of before^2 over finite before, float64",
    ),
    Statistic(
        "amax", "float32", PER_TENSOR, MAX, "amax", 0.0, None, False,
        "max |after| over finite after (0 when there is none)",
    ),
)  # fmt: skip


def _update_ratio(v: Mapping[str, Any]) -> Any:
    """sqrt(sq_change / sq_weight): NaN where sq_weight is 0 (a weight of zeros has no scale to compare with)."""
    change, weight = v["sq_change"], v["sq_weight"]
    if _is_number(change) and _is_number(weight):
        return math.sqrt(change / weight) if weight else math.nan
    if hasattr(change, "sqrt"):  # torch: 0 / 0 is NaN, x / 0 is inf, which the where replaces
        return (change / weight).sqrt().where(weight != 0, math.nan)
    import numpy as np

    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(np.asarray(weight) != 0, np.sqrt(np.asarray(change) / weight), np.nan)


UPDATE_DERIVED: tuple[Derived, ...] = (
    Derived(
        "update_ratio", ("sq_change", "sq_weight"), _update_ratio, None, False,
        "||after - before|| / ||before|| over the finite elements (NaN where sq_weight is 0)",
    ),
    Derived(
        "lost_fraction", ("lost", "with_grad"), lambda v: _fraction(v["lost"], v["with_grad"]), None, False,
        "lost / with_grad (NaN where with_grad is 0)",
    ),
)  # fmt: skip

UPDATE_BY_NAME: dict[str, Statistic] = {s.name: s for s in UPDATE}
UPDATE_DERIVED_BY_NAME: dict[str, Derived] = {d.name: d for d in UPDATE_DERIVED}
UPDATE_OUTPUTS: tuple[Output, ...] = _outputs(UPDATE, UPDATE_DERIVED)
UPDATE_OUTPUT_NAMES: tuple[str, ...] = tuple(o.name for o in UPDATE_OUTPUTS)


def derive_update(name: str, values: Mapping[str, Any]) -> Any:
    """Derived update value ``name`` of merged update statistics ``values`` (by name)."""
    return derive_from(UPDATE_DERIVED_BY_NAME, name, values)


def new_update_outputs(rows: int, device: Any, *, filled: bool) -> tuple[torch.Tensor, ...]:
    """The update_stats op's outputs for ``rows`` tensors: each statistic's ``empty`` value (``filled``) or
    uninitialised (the fake kernel's). Imports torch."""
    import torch

    made = []
    for o in UPDATE_OUTPUTS:
        shape, dtype = o.shape(rows, 0), getattr(torch, o.dtype)
        made.append(
            torch.full(shape, float(o.statistics[0].empty), dtype=dtype, device=device)
            if filled
            else torch.empty(shape, dtype=dtype, device=device)
        )
    return tuple(made)


# ---------------------------------------------------------------------------------------------- the C++ tables


def layout_problem(native: Mapping[str, Any]) -> str | None:
    """Where the tables a compiled extension reports (``amp_inspect._C.layout()``) differ from this package's:
    one clause, or None when they agree. A binary built from other sources would put statistics in other
    columns; the extension is not used then."""
    names = tuple(native.get("formats", ()))
    if names != tuple(FORMAT_BOUNDS):
        return f"its formats are {', '.join(names)}, this package's {', '.join(FORMAT_BOUNDS)}"
    for name, bits in zip(names, native.get("format_bounds", ()), strict=False):
        if tuple(bits) != FORMAT_BOUNDS[name].bits:
            ours = tuple(map(hex, FORMAT_BOUNDS[name].bits))
            return f"its {name} bounds are {tuple(map(hex, bits))}, this package's {ours}"
    if len(native.get("format_bounds", ())) != len(names) or native.get("max_formats") != len(names):
        return "its format table has another length"
    if native.get("hist_bins") != HIST_BINS:
        return f"its histograms have {native.get('hist_bins')} bins, this package's {HIST_BINS}"
    counts = [o for o in OUTPUTS if not o.one_dimensional and any(s.per == PER_FORMAT for s in o.statistics)]
    fixed = sum(1 for o in counts for s in o.statistics if s.per == PER_TENSOR)
    per_format = sum(1 for o in counts for s in o.statistics if s.per == PER_FORMAT)
    if (native.get("fixed_count_columns"), native.get("count_columns_per_format")) != (fixed, per_format):
        return (
            f"its count columns are {native.get('fixed_count_columns')} + {native.get('count_columns_per_format')} per "
            f"format, this package's {fixed} + {per_format}"
        )
    theirs = [tuple(o) for o in native.get("outputs", ())]
    ours = [(o.name, o.dtype, _columns_kind(o), float(o.statistics[0].empty)) for o in OUTPUTS]
    if theirs != ours:
        return f"its outputs are {theirs}, this package's {ours}"
    if any(o.statistics[0].empty != s.empty for o in OUTPUTS for s in o.statistics):
        return "an output's statistics start from different empty values"  # the C++ fills one value per output
    return readiness_layout_problem(native) or update_layout_problem(native)


def readiness_layout_problem(native: Mapping[str, Any]) -> str | None:
    """Where format readiness's tables in ``_C.layout()["readiness"]`` (csrc/readiness/readiness.h: the recipes, their
    element formats and scale rules, the op's columns and outputs) differ from core/recipes.py's and ``READINESS``'s:
    one clause, or None. A binary without the table (built before format readiness) is refused like one whose tables
    differ: a binary is used whole or not at all."""
    from amp_inspect.core import recipes

    theirs = native.get("readiness")
    if theirs is None:
        return "it has no format_readiness op (built before format readiness)"
    ours_recipes = tuple((r.name, r.element, r.block, r.scale) for r in recipes.RECIPES)
    if tuple(tuple(r) for r in theirs.get("recipes", ())) != ours_recipes:
        return f"its recipes are {tuple(tuple(r) for r in theirs.get('recipes', ()))}, this package's {ours_recipes}"
    ours_elements = tuple(
        (f.name, f.mbits, f.emin, f.emax, struct.unpack("<I", struct.pack("<f", f.max_value))[0])
        for f in recipes.ELEMENT_FORMATS.values()
    )
    if tuple(tuple(e) for e in theirs.get("element_formats", ())) != ours_elements:
        return f"its element formats are {theirs.get('element_formats')}, this package's {ours_elements}"
    if tuple(theirs.get("scale_rules", ())) != recipes.SCALE_RULES:
        return f"its scale rules are {theirs.get('scale_rules')}, this package's {recipes.SCALE_RULES}"
    limits = (recipes.E8M0_MIN_EXPONENT, recipes.E8M0_MAX_EXPONENT, recipes.NVFP4_TENSOR_DIVISOR)
    if (*theirs.get("e8m0_exponents", ()), theirs.get("nvfp4_tensor_divisor")) != limits:
        return f"its E8M0 range or NVFP4 divisor differ from this package's {limits}"
    counts, sums = READINESS_OUTPUTS[0], READINESS_OUTPUTS[1]
    ours_columns = tuple(
        n for o in (counts, sums) for n in (sum(s.per == PER_TENSOR for s in o.statistics), o.columns(1) - o.columns(0))
    )
    if tuple(theirs.get("columns", ())) != ours_columns:
        return f"its readiness columns are {theirs.get('columns')}, this package's {ours_columns}"
    ours_outputs = tuple((o.name, o.dtype) for o in READINESS_OUTPUTS)
    if tuple(tuple(o) for o in theirs.get("outputs", ())) != ours_outputs:
        return f"its readiness outputs are {theirs.get('outputs')}, this package's {ours_outputs}"
    return None


def update_layout_problem(native: Mapping[str, Any]) -> str | None:
    """Where update_stats's columns in ``_C.layout()["update"]`` (csrc/update_stats/update_stats.h) differ from
    ``UPDATE``'s: one clause, or None. A binary without the table (built before update_stats) is refused whole."""
    theirs = native.get("update")
    if theirs is None:
        return "it has no update_stats op (built before update_stats)"
    for output in UPDATE_OUTPUTS[:2]:  # counts and sums, column by column
        ours = tuple(s.name for s in output.statistics)
        if tuple(theirs.get(output.name, ())) != ours:
            return f"its update {output.name} columns are {theirs.get(output.name)}, this package's {ours}"
    ours_outputs = tuple((o.name, o.dtype) for o in UPDATE_OUTPUTS)
    if tuple(tuple(o) for o in theirs.get("outputs", ())) != ours_outputs:
        return f"its update outputs are {theirs.get('outputs')}, this package's {ours_outputs}"
    return None


def _columns_kind(o: Output) -> str:
    """How csrc/tensor_stats/tensor_stats_call.h's OutputColumns names this output's columns."""
    if o.one_dimensional:
        return "none"
    if [s.per for s in o.statistics] == [PER_BIN]:
        return "hist_bins"
    return "counts"
