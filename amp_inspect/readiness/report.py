"""The format-readiness table: per module, per GEMM operand and per recipe, what moving to that recipe would lose,
and a verdict per module and recipe (issue 21; docs/readiness.md walks through one).

Terms (the recipes and their exact rules: amp_inspect/core/recipes.py; the statistics:
amp_inspect/core/format_readiness.py):

- **operands**: the tensors a GEMM recipe quantizes, measured by readiness/hooks.py on readiness steps: ``X`` (a
  Linear's input), ``W`` (its weight, blocks along the reduction dimension) and ``dY`` (the gradient of its output),
  and ``dW`` (the weight's gradient at the end of the step). The recipes quantize X, W and dY only; dW is shown (a
  gradient all-reduce in FP8 would quantize it) but not judged.
- **flushed %**: finite nonzero elements whose quantized value is 0, over the finite nonzero elements;
  **saturated %**: finite elements clamped to the element format's largest value, over the same;
  **SQNR**: 10 log10(sum x^2 / sum (x - dequant(quant(x)))^2) over the finite elements, in dB (+inf: no error).
- **verdict** of a module for a recipe: the worst of its judged operands' levels, each level from the
  thresholds below (``THRESHOLDS``; docs/readiness.md says where they come from); an operand that holds NaN/Inf is
  "not ready" (a real cast would poison its block); one with nothing nonzero loses nothing.
- **merge**: statistics of disjoint elements add (counts and squared sums) and amax takes the maximum, so one
  module called twice in a step, a step's ranks and several steps merge by ``merged``.

Loss scaling multiplies dY and dW by a power of two: the block and tensor scales absorb it exactly (up to E8M0's
range), so the table is the same before and after unscaling.

Torch-free (plain Python numbers), so ``amp-inspect readiness run.jsonl`` reads a log without loading torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from amp_inspect.core.printable import shown_name
from amp_inspect.core.recipes import RECIPES_BY_NAME, check_recipes
from amp_inspect.core.table import fixed_width

OPERANDS = ("X", "W", "dY", "dW")
JUDGED_OPERANDS = ("X", "W", "dY")  # what the GEMM recipes quantize
READY, BORDERLINE, NOT_READY = "ready", "borderline", "not ready"
# A module of which no judged operand was measured: only its dW, because its forward was never called as a module
# (MultiheadAttention's out_proj: its weight goes to F.multi_head_attention_forward). Not a verdict: never "ready".
NOT_MEASURED = "not measured"
LEVELS = (READY, BORDERLINE, NOT_READY, NOT_MEASURED)  # best first; NOT_MEASURED last, so no count calls it ready
# Count columns of one operand's row (readiness/hooks.py lays its device rows out the same way): the three per-tensor
# counts, then each per-recipe count for every recipe in order.
TENSOR_COUNTS = ("numel", "nonzero", "nonfinite")
RECIPE_COUNTS = ("flushed", "saturated", "blocks", "scale_flushed")
SQNR_CAP_DB = 100.0  # where the best recipe averages SQNRs: +inf (nothing lost) counts as this


@dataclass(frozen=True)
class Thresholds:
    """The limits of one element format's verdicts: an operand is ready when its SQNR is at least ``ready_sqnr`` dB
    and at most ``ready_flushed`` of its nonzero elements flush; borderline within the ``borderline_*`` limits; not
    ready beyond either. Saturation is shown but not judged apart: these recipes clamp, and what a clamp costs is
    in the SQNR (the OCP rule's 0.8% of a Gaussian's elements clamped cost it 0.9 dB)."""

    ready_sqnr: float
    borderline_sqnr: float
    ready_flushed: float
    borderline_flushed: float


def mantissa_bound_db(mbits: int) -> float:
    """The SQNR of rounding to nearest with ``mbits`` mantissa bits, for values spread evenly over a binade:
    error uniform over one ulp (variance ulp^2 / 12) against a mean square of 7/3 the binade's start squared:
    10 log10(28 * 4^mbits) dB, 14.5 + 6.02 mbits. No scale does better; a real tensor does worse where its small
    elements fall to the format's subnormals (a Gaussian: 1 dB below it in E4M3, E5M2 and NVFP4, 2 in MXFP4)."""
    return 10.0 * math.log10(28.0 * 4.0**mbits)


def _thresholds(mbits: int, ready_flushed: float, borderline_flushed: float) -> Thresholds:
    # Ready: at most 4x the noise power of the format's ideal rounding (6 dB, one mantissa bit, below its bound);
    # borderline: at most 16x (12 dB, two bits).
    bound = mantissa_bound_db(mbits)
    return Thresholds(bound - 6.0, bound - 12.0, ready_flushed, borderline_flushed)


# By element format (docs/readiness.md: where they come from; a starting point). 8-bit elements reach 2^17 (E4M3)
# to 2^31 (E5M2) below the scale: a Gaussian flushes under 1e-5 of its elements, so 0.1% flushed is already a sign
# of a spread the format cannot hold; E2M1 spans only 0.5 to 6 and flushes, by design, every element below about a
# 24th of its block's amax (7-9% of a Gaussian, 13-16% of a Laplace): 10% / 25%.
THRESHOLDS: dict[str, Thresholds] = {
    "e4m3": _thresholds(3, 1e-3, 1e-2),
    "e5m2": _thresholds(2, 1e-3, 1e-2),
    "e2m1": _thresholds(1, 0.10, 0.25),
}


def _fraction(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def sqnr_db(sq_signal: float, sq_error: float) -> float:
    """10 log10(signal / error): +inf where nothing was lost, NaN where there is no signal."""
    if sq_signal <= 0:
        return math.nan
    if sq_error <= 0:
        return math.inf
    return 10.0 * math.log10(sq_signal / sq_error)


@dataclass(frozen=True)
class OperandStats:
    """One operand of one module, every recipe: host values (module docstring: the terms)."""

    numel: int
    nonzero: int
    nonfinite: int
    flushed: tuple[int, ...]
    saturated: tuple[int, ...]
    blocks: tuple[int, ...]
    scale_flushed: tuple[int, ...]
    sq_signal: float
    sq_error: tuple[float, ...]
    amax: float

    @classmethod
    def from_row(cls, counts: Sequence[int], sums: Sequence[float], amax: float, recipes: int) -> OperandStats:
        """From one device row as readiness/hooks.py lays it out: counts [3 + 4R], sums [1 + R], amax."""
        c = [int(v) for v in counts]
        per = [tuple(c[3 + k * recipes : 3 + (k + 1) * recipes]) for k in range(len(RECIPE_COUNTS))]
        return cls(c[0], c[1], c[2], *per, float(sums[0]), tuple(float(v) for v in sums[1:]), float(amax))

    def merged(self, other: OperandStats) -> OperandStats:
        """The statistics of both sets of elements: counts and sums add, amax the maximum."""

        def add(a: tuple, b: tuple) -> tuple:
            return tuple(x + y for x, y in zip(a, b, strict=True))

        return OperandStats(
            self.numel + other.numel,
            self.nonzero + other.nonzero,
            self.nonfinite + other.nonfinite,
            add(self.flushed, other.flushed),
            add(self.saturated, other.saturated),
            add(self.blocks, other.blocks),
            add(self.scale_flushed, other.scale_flushed),
            self.sq_signal + other.sq_signal,
            add(self.sq_error, other.sq_error),
            max(self.amax, other.amax),
        )

    def flushed_fraction(self, r: int) -> float:
        return _fraction(self.flushed[r], self.nonzero)

    def saturated_fraction(self, r: int) -> float:
        return _fraction(self.saturated[r], self.nonzero)

    def sqnr_db(self, r: int) -> float:
        return sqnr_db(self.sq_signal, self.sq_error[r])

    def to_record(self) -> dict[str, Any]:
        return {
            "numel": self.numel,
            "nonzero": self.nonzero,
            "nonfinite": self.nonfinite,
            "flushed": list(self.flushed),
            "saturated": list(self.saturated),
            "blocks": list(self.blocks),
            "scale_flushed": list(self.scale_flushed),
            "sq_signal": self.sq_signal,
            "sq_error": list(self.sq_error),
            "amax": self.amax,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any], recipes: int) -> OperandStats:
        """From a run log's entry; ValueError naming the field that is missing or of the wrong length."""
        per: dict[str, tuple] = {}
        for key in (*RECIPE_COUNTS, "sq_error"):
            value = record.get(key)
            if not isinstance(value, list) or len(value) != recipes:
                raise ValueError(f"readiness field {key!r} must be a list of {recipes} values, got {value!r:.40}")
            per[key] = tuple(float(v) for v in value) if key == "sq_error" else tuple(int(v) for v in value)
        return cls(
            int(record.get("numel", 0)),
            int(record.get("nonzero", 0)),
            int(record.get("nonfinite", 0)),
            per["flushed"],
            per["saturated"],
            per["blocks"],
            per["scale_flushed"],
            float(record.get("sq_signal", 0.0)),
            per["sq_error"],
            float(record.get("amax", 0.0)),
        )


@dataclass(frozen=True)
class Verdict:
    """A module's verdict for one recipe, and why (the operand and limit that decided it; "" when ready)."""

    level: str
    why: str = ""

    def __str__(self) -> str:
        return self.level if not self.why else f"{self.level} ({self.why})"


def operand_level(stats: OperandStats, recipe: str, r: int) -> Verdict:
    """The level of one operand for the recipe in column ``r`` (module docstring: the rule)."""
    if stats.nonfinite:
        return Verdict(NOT_READY, f"{stats.nonfinite} NaN/Inf")
    if stats.nonzero == 0:
        return Verdict(READY)
    limits = THRESHOLDS[RECIPES_BY_NAME[recipe].element]
    sqnr, flushed = stats.sqnr_db(r), stats.flushed_fraction(r)
    if sqnr >= limits.ready_sqnr and flushed <= limits.ready_flushed:
        return Verdict(READY)
    reasons = []
    if sqnr < limits.ready_sqnr:
        reasons.append(f"SQNR {sqnr:.1f} dB")
    if flushed > limits.ready_flushed:
        reasons.append(f"{flushed:.2%} flushed")
    bad = sqnr < limits.borderline_sqnr or flushed > limits.borderline_flushed
    return Verdict(NOT_READY if bad else BORDERLINE, ", ".join(reasons))


class _Pending(Protocol):
    """Device statistics on their way to the host (report.HostCopy)."""

    def ready(self) -> bool: ...

    def host(self) -> Mapping[str, Any]: ...


class ReadinessReport:
    """The readiness of one step (or of several merged): per module and operand an ``OperandStats``.

    Made either from host values (``modules``) or from device rows on their way to the host (``pending``, with
    ``keys``: the (module, operand) of each row): nothing is read until a value is asked for.
    """

    def __init__(
        self,
        recipes: Sequence[str],
        modules: Mapping[str, Mapping[str, OperandStats]] | None = None,
        *,
        step: int | None = None,
        pending: _Pending | None = None,
        keys: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.recipes = check_recipes(recipes)
        self.step = step
        self._pending = pending
        self._keys = list(keys)
        self._modules: dict[str, dict[str, OperandStats]] | None = (
            None if modules is None else {m: dict(ops) for m, ops in modules.items()}
        )
        if modules is None and pending is None:
            self._modules = {}

    def ready(self) -> bool:
        """Whether the values can be read without waiting for the device."""
        return self._modules is not None or self._pending is None or self._pending.ready()

    @property
    def modules(self) -> dict[str, dict[str, OperandStats]]:
        """module -> operand -> OperandStats, modules in the order they were measured (reads the device once)."""
        if self._modules is None:
            assert self._pending is not None
            h = self._pending.host()
            counts, sums, amax = h["counts"].tolist(), h["sums"].tolist(), h["amax"].tolist()
            out: dict[str, dict[str, OperandStats]] = {}
            for (module, operand), c, s, a in zip(self._keys, counts, sums, amax, strict=True):
                out.setdefault(module, {})[operand] = OperandStats.from_row(c, s, a, len(self.recipes))
            self._modules = {
                m: dict(sorted(ops.items(), key=lambda kv: OPERANDS.index(kv[0]))) for m, ops in out.items()
            }
            self._pending = None
        return self._modules

    # ---- verdicts ----

    def verdict(self, module: str, recipe: str) -> Verdict:
        """The worst level of the module's judged operands for ``recipe``, naming the operand that decided it."""
        r = self.recipes.index(recipe)
        if not any(operand in JUDGED_OPERANDS for operand in self.modules[module]):
            return Verdict(NOT_MEASURED, "only dW: its forward was not called as a module, so X, W and dY went unseen")
        worst = Verdict(READY)
        for operand, stats in self.modules[module].items():
            if operand not in JUDGED_OPERANDS:
                continue
            level = operand_level(stats, recipe, r)
            if LEVELS.index(level.level) > LEVELS.index(worst.level):
                worst = Verdict(level.level, f"{operand}: {level.why}")
        return worst

    def verdicts(self) -> dict[str, dict[str, Verdict]]:
        """recipe -> module -> Verdict."""
        return {recipe: {m: self.verdict(m, recipe) for m in self.modules} for recipe in self.recipes}

    def ready_counts(self) -> dict[str, dict[str, int]]:
        """recipe -> level -> how many modules have it."""
        out = {}
        for recipe, by_module in self.verdicts().items():
            levels = [v.level for v in by_module.values()]
            out[recipe] = {level: levels.count(level) for level in LEVELS}
        return out

    def best_recipe(self, among: Sequence[str] | None = None) -> str | None:
        """The recipe (of ``among``, default all) that keeps the most modules ready; among those, the one with fewest
        modules not ready, then the most accurate (highest mean over modules of their worst judged operand's SQNR,
        capped at 100 dB), then the first in the recipes' order. None without modules."""
        if not self.modules:
            return None
        counts = self.ready_counts()

        def key(recipe: str) -> tuple[int, int, float, int]:
            return (
                -counts[recipe][READY],
                counts[recipe][NOT_READY],
                -self.mean_worst_sqnr(recipe),
                self.recipes.index(recipe),
            )

        return min(self.recipes if among is None else check_recipes(among), key=key)

    def mean_worst_sqnr(self, recipe: str) -> float:
        """The mean over modules of the lowest SQNR of their judged operands under ``recipe`` (each capped at 100 dB:
        +inf, nothing lost, would outweigh every other module); 100 when no operand has a signal."""
        r = self.recipes.index(recipe)
        worst = []
        for ops in self.modules.values():
            values = [s.sqnr_db(r) for op, s in ops.items() if op in JUDGED_OPERANDS and s.nonzero and not s.nonfinite]
            if values:
                worst.append(min(min(values), SQNR_CAP_DB))
        return sum(worst) / len(worst) if worst else SQNR_CAP_DB

    # ---- merging, the log ----

    def merged(self, other: ReadinessReport) -> ReadinessReport:
        """Both reports' statistics merged (ranks, steps): counts and sums add, amax the maximum. Same recipes."""
        if other.recipes != self.recipes:
            raise ValueError(f"cannot merge readiness of recipes {list(other.recipes)} into {list(self.recipes)}")
        out = {m: dict(ops) for m, ops in self.modules.items()}
        for module, ops in other.modules.items():
            mine = out.setdefault(module, {})
            for operand, stats in ops.items():
                mine[operand] = mine[operand].merged(stats) if operand in mine else stats
        return ReadinessReport(self.recipes, out, step=self.step if self.step == other.step else None)

    def to_record(self) -> dict[str, Any]:
        """The run log's ``"readiness"`` entry (runlog/log.py)."""
        return {
            "recipes": list(self.recipes),
            "modules": {m: {op: s.to_record() for op, s in ops.items()} for m, ops in self.modules.items()},
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any], step: int | None = None) -> ReadinessReport:
        """From a run log's ``"readiness"`` entry; ValueError saying what is wrong with it."""
        try:
            return cls._from_record(record, step)
        except TypeError as error:  # a value of the wrong kind (None, an object) where a number or name belongs
            raise ValueError(f"a readiness entry of the log is malformed ({error})") from None

    @classmethod
    def _from_record(cls, record: Mapping[str, Any], step: int | None) -> ReadinessReport:
        names = record.get("recipes")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f'readiness "recipes" must be a list of recipe names, got {names!r:.60}')
        recipes = check_recipes(names)
        modules: dict[str, dict[str, OperandStats]] = {}
        raw = record.get("modules")
        if not isinstance(raw, Mapping):
            raise ValueError('readiness "modules" must be an object')
        for module, ops in raw.items():
            if not isinstance(ops, Mapping) or not set(ops) <= set(OPERANDS):
                raise ValueError(f"readiness of module {shown_name(str(module))!r} must map operands {OPERANDS}")
            modules[module] = {op: OperandStats.from_record(s, len(recipes)) for op, s in ops.items()}
        return cls(recipes, modules, step=step)

    # ---- text ----

    def table_rows(self, recipes: Sequence[str] | None = None) -> list[list[str]]:
        """One row per module and operand: module, operand, then flushed % / saturated % / SQNR per recipe."""
        shown = self.recipes if recipes is None else check_recipes(recipes)
        rows = []
        for module, ops in self.modules.items():
            for operand, stats in ops.items():
                row = [shown_name(module), operand]
                for recipe in shown:
                    r = self.recipes.index(recipe)
                    row.append(_cell(stats, r))
                rows.append(row)
        return rows

    def lines(self, recipes: Sequence[str] | None = None) -> list[str]:
        """The table, the verdicts and the best recipe, as text lines."""
        shown = self.recipes if recipes is None else check_recipes(recipes)
        when = f" at step {self.step}" if self.step is not None else ""
        if not self.modules:
            return [f"format readiness{when}: no GEMM module was measured"]
        lines = [f"format readiness{when}: flushed % / saturated % / SQNR dB, per module, operand and recipe"]
        lines += fixed_width(["module", "op", *shown], self.table_rows(shown))
        lines += ["", "verdicts (X, W, dY judged; dW shown only):"]
        verdict_rows = []
        for module in self.modules:
            verdict_rows.append([shown_name(module), *(self.verdict(module, recipe).level for recipe in shown)])
        lines += fixed_width(["module", *shown], verdict_rows)
        counts = self.ready_counts()
        lines.append("")
        lines.append(
            "ready modules: " + ", ".join(f"{recipe} {counts[recipe][READY]}/{len(self.modules)}" for recipe in shown)
        )
        best = self.best_recipe(shown)
        if best is not None:
            of = "" if len(shown) == len(self.recipes) else " (of those shown)"
            lines.append(f"the recipe that keeps the most modules ready{of}: {best}")
        for recipe in shown:
            reasons = [(m, v) for m, v in self.verdicts()[recipe].items() if v.level != READY]
            for module, verdict in reasons[:3]:
                lines.append(f"  {recipe}: {shown_name(module)} {verdict}")
            if len(reasons) > 3:
                lines.append(f"  {recipe}: ... and {len(reasons) - 3} more modules not ready or borderline")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"ReadinessReport(step={self.step}, recipes={list(self.recipes)})"


def _cell(stats: OperandStats, r: int) -> str:
    """flushed % / saturated % / SQNR of one operand and recipe."""
    if stats.nonfinite:
        return f"{stats.nonfinite} NaN/Inf"
    sqnr = stats.sqnr_db(r)
    shown = "-" if math.isnan(sqnr) else ("inf" if math.isinf(sqnr) else f"{sqnr:.1f}")
    return f"{_percent(stats.flushed_fraction(r))}/{_percent(stats.saturated_fraction(r))}/{shown}"


def _percent(fraction: float) -> str:
    if fraction == 0:
        return "0"
    percent = 100 * fraction
    return f"{percent:.2g}" if percent < 10 else f"{percent:.0f}"


def from_log(records: Iterable[Mapping[str, Any]]) -> list[ReadinessReport]:
    """The readiness of every record of a run log that carries one, in order."""
    return [ReadinessReport.from_record(r["readiness"], r.get("step")) for r in records if r.get("readiness")]
