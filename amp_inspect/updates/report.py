"""What ``optimizer.step()`` did, per module (``insp.last_update``, issue 22): ``UpdateStats`` and the verdicts
the summary, the doctor and the HTML report give on it. updates/watch.py measures it.

Terms (core/statistics.py ``UPDATE`` defines each statistic; amp_inspect/core/update_stats.py the op):

- **numel_with_grad**: elements whose gradient, as the optimizer saw it, was finite and nonzero;
- **lost**: those whose weight did not change (the update was rounded away in the weight's dtype: a bf16 weight
  near 1 rounds away any step below 2^-9 of it); **lost_fraction** = lost / numel_with_grad;
- **update_ratio**: ||W_after - W_before|| / ||W_before|| over the module's parameters (the root of its summed
  squared change over its summed squared weight);
- **state_underflow**: with-grad elements whose Adam second moment (``exp_avg_sq``) is zero or subnormal in its
  dtype: Adam's step is then m / eps;
- **weight_amax**: max |W| after the step;
- **made_nonfinite**: elements whose weight and gradient were finite before the step and whose weight is NaN or Inf
  after it: the optimizer step itself made them (an fp16 Adam state that underflowed divides by eps; an update past
  the weight's dtype's largest value).

A module's statistics are its parameter tensors' merged by the schema's rules (counts and sums add, amax the
maximum), and so are several optimizers', FSDP2 ranks' shards and several measured steps.

The verdicts and their thresholds (docs/usage.md, "What the optimizer did", says where they come from):

- **updates rounded away**: a module with at least ``LOST_THRESHOLD`` (5%) of its with-grad updates lost over the
  measured steps. With fp32 weights (or fp32 master weights) an update is lost only where it is below 2^-24 of
  its weight, which almost never happens, so percents mean the weight's dtype eats the updates.
- **optimizer state underflow**: a module with at least ``STATE_UNDERFLOW_THRESHOLD`` (0.1%) of its with-grad
  elements' exp_avg_sq zero or subnormal: each such element's step is divided by eps alone.
- **weights made NaN/Inf by the step** (an error): a module with any ``made_nonfinite`` element. Every later step
  computes with those weights, so the NaN/Inf the gradients show from then on starts here, not in the forward pass.
- **update ratio out of range**: ~1e-3 per step is the commonly quoted healthy update-to-weight ratio (Karpathy's
  "update/data ratio", the log10 of which should sit near -3); a module whose median ratio over the measured
  steps is above ``RATIO_HIGH`` (1e-2) changes by over 1% a step, and one whose ratio is exactly 0 on every
  measured step while it had gradients does not train (when its updates were all rounded away, the first
  verdict names it instead). A module whose weights were all zero before a measured step (LoRA's B, a
  zero-initialised projection) is left out of "above": its ||W|| is its own updates' sum, so its ratio starts
  high and falls like 1 / steps whatever the learning rate.

A parameter group whose learning rate is 0 on a measured step (the first step of a warm-up from 0, a group frozen
by its rate) was asked to change nothing: its elements count no gradient (numel_with_grad 0), so none is lost and
its ratio of 0 is no verdict, unless its learning rate was 0 on every measured step (``numel_lr_zero``, the
elements so held, equals ``numel``): then it does not train, as a ratio of exactly 0 says.

An optimizer that keeps the part of an update below half an ulp of a 16-bit weight (torchao's
``bf16_stochastic_round``, a Kahan compensation buffer ``kahan_comp`` in the state, as optimi's ``kahan_sum``) loses
nothing when a step leaves the weight unchanged: the rounding is unbiased, or the remainder is carried into the
next step. Its elements count in ``numel_kept`` and none in ``lost``, so the first verdict does not advise what the
run already does.

Torch-free (plain numbers), so ``amp-inspect summary`` reads a log without loading torch.
"""

from __future__ import annotations

import math
import statistics as stats_lib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from amp_inspect.core.advice import Advice
from amp_inspect.core.printable import shown_name
from amp_inspect.core.statistics import MAX, UPDATE, derive_update
from amp_inspect.core.table import fixed_width

LOST_THRESHOLD = 0.05
STATE_UNDERFLOW_THRESHOLD = 1e-3
RATIO_HEALTHY = 1e-3
RATIO_HIGH = 1e-2
MAX_NAMED = 5  # modules a verdict names, worst first
# The op's statistic names as by_module shows them (the words), the rest as the schema names them.
SHOWN = {"with_grad": "numel_with_grad", "amax": "weight_amax"}
COUNT_FIELDS = tuple(SHOWN.get(s.name, s.name) for s in UPDATE if s.is_count)
FLOAT_FIELDS = tuple(SHOWN.get(s.name, s.name) for s in UPDATE if not s.is_count)
DERIVED_FIELDS = ("lost_fraction", "update_ratio")
TEXT_FIELDS = ("dtype", "state_dtype")  # the parameter's dtype, its exp_avg_sq's (None without one)
# Counted by the watch from what it knows on the host, not by the op (0 in old logs): elements whose parameter group
# had learning rate 0 on the step, and elements whose optimizer keeps the sub-ulp part of their updates
# (stochastic rounding, Kahan compensation: updates/watch.py says how it knows).
LR_ZERO_FIELD = "numel_lr_zero"
KEPT_FIELD = "numel_kept"
HOST_COUNT_FIELDS = (LR_ZERO_FIELD, KEPT_FIELD)
# Counts the op gained after the first logs were written: 0 where a record has none.
LATER_COUNT_FIELDS = ("made_nonfinite",)


class _Pending(Protocol):
    """Device statistics on their way to the host (report.HostCopy)."""

    def ready(self) -> bool: ...

    def host(self) -> Mapping[str, Any]: ...


def _with_derived(values: Mapping[str, Any]) -> dict[str, Any]:
    """A module record: the merged statistics by their shown names, and the derived fractions."""
    out = dict(values)
    for key in LATER_COUNT_FIELDS:
        out.setdefault(key, 0)
    raw = {s.name: out[SHOWN.get(s.name, s.name)] for s in UPDATE}
    for name in DERIVED_FIELDS:
        out[name] = float(derive_update(name, raw))
    return out


def merge_records(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two module records of disjoint elements as one (each statistic by its merge; dtypes kept when they agree)."""
    out: dict[str, Any] = {}
    for s in UPDATE:
        key = SHOWN.get(s.name, s.name)
        out[key] = max(a[key], b[key]) if s.merge == MAX else a[key] + b[key]
    for key in HOST_COUNT_FIELDS:
        out[key] = a.get(key, 0) + b.get(key, 0)
    for key in TEXT_FIELDS:
        out[key] = a.get(key) if a.get(key) == b.get(key) else "mixed"
    return _with_derived(out)


class UpdateStats:
    """What one measured optimizer step (or several merged) did, per module: ``by_module[name]`` holds
    ``numel_with_grad``, ``lost``, ``lost_fraction``, ``update_ratio``, ``state_underflow``, ``weight_amax`` (and
    ``numel``, ``changed``, ``weight_nonfinite``, ``weight_subnormal``, ``sq_change``, ``sq_weight``, ``dtype``,
    ``state_dtype``, ``numel_lr_zero``, ``numel_kept``). Made from host records or from device rows on their way to
    the host (nothing is read until a value is asked for). ``skipped``: a fused optimizer's step that GradScaler's
    found_inf turned off."""

    def __init__(
        self, step: int | None, modules: Mapping[str, Mapping[str, Any]] | None = None, *, complete: bool = True
    ) -> None:
        self.step = step
        self.complete = complete  # False while optimizers of the step may still add their statistics
        # (copy of counts / sums / amax / applied, the module of each row, the (dtype, state dtype) of each row,
        # the (asked, kept) of each row: add() says what they mean)
        self._pending: list[
            tuple[_Pending, Sequence[str], Sequence[tuple[str, str | None]], Sequence[tuple[bool, bool]]]
        ] = []
        self._modules: dict[str, dict[str, Any]] = {m: _with_derived(r) for m, r in (modules or {}).items()}
        self._skipped = False

    def add(
        self,
        copy: _Pending,
        names: Sequence[str],
        dtypes: Sequence[tuple[str, str | None]],
        asked: Sequence[bool] | None = None,
        kept: Sequence[bool] | None = None,
    ) -> None:
        """Device rows on their way to the host (``copy`` holds counts, sums, amax and the flag applied, and may hold
        ``asked``, the same per row as device flags, ANDed with the host's). ``asked``:
        per row, whether the step was asked to move it (False: its group's learning rate was 0, so an unchanged
        weight is no lost update: the row counts no element with a gradient and none lost). ``kept``: per row,
        whether its optimizer keeps the sub-ulp part of the update (stochastic rounding, Kahan compensation): an
        unchanged weight there lost nothing either (the row counts none lost)."""
        asked = [True] * len(names) if asked is None else list(asked)
        kept = [False] * len(names) if kept is None else list(kept)
        self._pending.append((copy, list(names), list(dtypes), list(zip(asked, kept, strict=True))))

    def ready(self) -> bool:
        """Whether the values are all there and can be read without waiting for the device."""
        return self.complete and all(p.ready() for p, _, _, _ in self._pending)

    def _read(self) -> None:
        modules = self._modules
        for copy, names, dtypes, notes in self._pending:
            h = copy.host()
            if not bool(h["applied"]):
                self._skipped = True  # a fused step turned off by found_inf: nothing changed, nothing was lost
                continue
            rows = {"counts": h["counts"].tolist(), "sums": h["sums"].tolist(), "amax": h["amax"].tolist()}
            on_device = h["asked"].tolist() if "asked" in h else None  # per row, a learning rate read on the device
            for i, name in enumerate(names):
                record: dict[str, Any] = {}
                position = {"counts": 0, "sums": 0}
                for s in UPDATE:
                    if s.output == "amax":
                        value = float(rows["amax"][i])
                    else:
                        value = rows[s.output][i][position[s.output]]
                        position[s.output] += 1
                    record[SHOWN.get(s.name, s.name)] = int(value) if s.is_count else float(value)
                record["dtype"], record["state_dtype"] = dtypes[i]
                asked, kept = notes[i]
                asked = asked and (on_device is None or bool(on_device[i]))
                record[LR_ZERO_FIELD] = 0 if asked else record["numel"]
                record[KEPT_FIELD] = record["numel"] if kept and asked else 0  # at lr 0: counted as that alone
                if not asked:  # learning rate 0: nothing was asked of these elements, nothing could be lost
                    record["numel_with_grad"] = record["lost"] = record["state_underflow"] = 0
                if kept:  # the rounded-off part lives on (stochastic rounding, a compensation buffer)
                    record["lost"] = 0
                record = _with_derived(record)
                modules[name] = merge_records(modules[name], record) if name in modules else record
        self._pending = []

    @property
    def by_module(self) -> dict[str, dict[str, Any]]:
        """module -> its record (module docstring: the terms); reads the device once."""
        if self._pending:
            self._read()
        return self._modules

    @property
    def skipped(self) -> bool:
        """The step was measured but did not apply (a fused optimizer's step under GradScaler with NaN/Inf)."""
        self.by_module  # noqa: B018 - reads the device copy, which says so
        return self._skipped

    def total(self) -> dict[str, Any] | None:
        """Every module merged into one record; None without modules."""
        records = list(self.by_module.values())
        if not records:
            return None
        out = records[0]
        for r in records[1:]:
            out = merge_records(out, r)
        return out

    def merged(self, other: UpdateStats) -> UpdateStats:
        """Both steps' (or ranks') statistics merged by module."""
        out = {m: dict(r) for m, r in self.by_module.items()}
        for module, record in other.by_module.items():
            out[module] = merge_records(out[module], record) if module in out else dict(record)
        return UpdateStats(self.step if self.step == other.step else None, out)

    def to_record(self) -> dict[str, Any]:
        """The run log's ``"update"`` entry (runlog/log.py)."""
        record: dict[str, Any] = {"modules": self.by_module}
        if self._skipped:
            record["skipped"] = True
        return record

    @classmethod
    def from_record(cls, record: Mapping[str, Any], step: int | None = None) -> UpdateStats:
        """From a run log's ``"update"`` entry; ValueError saying what is wrong with it."""
        raw = record.get("modules")
        if not isinstance(raw, Mapping):
            raise ValueError('an "update" entry of the log needs "modules", an object')
        modules: dict[str, dict[str, Any]] = {}
        for name, m in raw.items():
            if not isinstance(m, Mapping):
                raise ValueError(f"the update record of module {shown_name(str(name))!r} is not an object")
            try:
                values: dict[str, Any] = {
                    k: int(m[k] if k not in LATER_COUNT_FIELDS else m.get(k, 0)) for k in COUNT_FIELDS
                }
                values.update({k: float(m[k]) for k in FLOAT_FIELDS})
                values.update({k: int(m.get(k, 0)) for k in HOST_COUNT_FIELDS})
            except (KeyError, TypeError, ValueError) as error:
                raise ValueError(
                    f"the update record of module {shown_name(str(name))!r} is malformed ({error})"
                ) from None
            values.update({k: m.get(k) for k in TEXT_FIELDS})
            modules[str(name)] = _with_derived(values)
        out = cls(step, modules)
        out._skipped = bool(record.get("skipped", False))
        return out

    def lines(self) -> list[str]:
        """A table of the modules: with-grad elements, lost %, update ratio, state underflow, weight amax."""
        when = f" at step {self.step}" if self.step is not None else ""
        if self.skipped and not self.by_module:
            return [f"optimizer step{when}: skipped (NaN/Inf gradients), nothing changed"]
        rows = [
            [
                shown_name(name),
                str(m["numel_with_grad"]),
                _percent(m["lost_fraction"]),
                _ratio(m["update_ratio"]),
                str(m["state_underflow"]),
                f"{m['weight_amax']:.3g}",
                shown_name(str(m.get("dtype"))),
            ]
            for name, m in self.by_module.items()
        ]
        headers = ["module", "with grad", "lost", "update ratio", "state underflow", "max |W|", "dtype"]
        return [f"optimizer step{when}: what it did per module", *fixed_width(headers, rows)]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"UpdateStats(step={self.step})"


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:.3g}%"


def _ratio(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2e}"


# ---- the verdicts ----


@dataclass(frozen=True)
class UpdateVerdict:
    """One verdict on the measured updates: ``code`` (the doctor's), what the run shows, what to do."""

    code: str
    seen: str
    fix: str
    severity: str = "warning"

    @property
    def advice(self) -> Advice:
        """As the summary's advice lines read: "what the run shows: what to do", filed under its code."""
        return Advice(self.seen, self.fix, code=self.code, severity=self.severity)


def _named(modules: Sequence[str]) -> str:
    shown = ", ".join(shown_name(m) for m in modules[:MAX_NAMED])
    return shown + (f" and {len(modules) - MAX_NAMED} more" if len(modules) > MAX_NAMED else "")


def _dtypes(records: Iterable[Mapping[str, Any]], key: str) -> str:
    names = sorted({shown_name(str(r.get(key))) for r in records if r.get(key) not in (None, "mixed")})
    return "/".join(names) or "low-precision"


@dataclass(frozen=True)
class UpdateOverview:
    """A run's measured optimizer steps merged by module: what the summary's table and the verdicts read.

    ``merged``: every applied measured step's statistics added by module; ``ratios[module]``: its update ratio on
    each of those steps where it had gradients; ``skipped``: measured steps that did not apply (a fused
    optimizer's found_inf); ``from_zeros``: modules whose weights were all zero before a measured step (LoRA's B,
    zero-initialised projections): their ||W|| is made of their own updates, so their ratio falls like 1 / steps
    whatever the learning rate, and the update-ratio verdict leaves them out."""

    steps: int
    skipped: int
    merged: UpdateStats
    ratios: dict[str, list[float]]
    from_zeros: frozenset[str] = frozenset()
    first_made_nonfinite: int | None = None  # the first measured step on which the step made a weight NaN/Inf

    @property
    def median_ratio(self) -> dict[str, float]:
        """module -> the median over the measured steps of its update ratio (what the update-ratio verdict judges)."""
        return {m: stats_lib.median(v) for m, v in self.ratios.items()}

    @property
    def steps_text(self) -> str:
        return f"{self.steps} measured optimizer step{'s' if self.steps != 1 else ''}"

    def headline(self) -> str:
        """One line: what the optimizer did over the measured steps, all modules together."""
        total = self.merged.total()
        assert total is not None  # an overview has modules (overview() returns None otherwise)
        skipped = f", {self.skipped} more skipped (NaN/Inf, nothing applied)" if self.skipped else ""
        line = f"what the optimizer did ({self.steps_text}{skipped}): "
        if total["numel_with_grad"]:
            lost = f"{total['lost']:,} of {total['numel_with_grad']:,}"
            line += f"{lost} updates lost ({_percent(total['lost_fraction'])}: the weight did not change)"
        elif total.get(LR_ZERO_FIELD):
            line += "no update was asked for"
        else:
            line += "no element had a finite nonzero gradient"
        if total.get(LR_ZERO_FIELD):
            line += f", {total[LR_ZERO_FIELD]:,} elements at learning rate 0 (nothing asked of them, none lost)"
        if total.get(KEPT_FIELD):
            line += f", {total[KEPT_FIELD]:,} elements under stochastic rounding or compensated summation (none lost)"
        if total["state_underflow"]:
            line += f", {total['state_underflow']:,} with exp_avg_sq zero or subnormal"
        if total["made_nonfinite"]:
            line += f", {total['made_nonfinite']:,} finite weights made NaN/Inf by the step"
        ratios = list(self.median_ratio.values())
        if ratios:
            line += f"; update ratio per module (median per step) {_ratio(min(ratios))} to {_ratio(max(ratios))}"
        return line

    def worst(self) -> list[str]:
        """The modules, worst first: by lost fraction, then exp_avg_sq underflow, then median update ratio."""
        modules, median = self.merged.by_module, self.median_ratio

        def badness(name: str) -> tuple[float, float, float]:
            r = modules[name]
            with_grad = r["numel_with_grad"]
            lost = r["lost_fraction"] if with_grad else 0.0
            underflow = r["state_underflow"] / with_grad if with_grad else 0.0
            return (-lost, -underflow, -median.get(name, 0.0))

        return sorted(modules, key=badness)

    def rows(self, limit: int | None = None) -> list[list[str]]:
        """Table rows (``ROW_HEADERS``), worst first, at most ``limit``."""
        modules, median = self.merged.by_module, self.median_ratio
        names = self.worst()[:limit]
        return [
            [
                name,
                f"{modules[name]['numel_with_grad']:,}",
                _percent(modules[name]["lost_fraction"]),
                _ratio(median.get(name, math.nan)),
                f"{modules[name]['state_underflow']:,}",
                f"{modules[name]['weight_amax']:.3g}",
                shown_name(str(modules[name].get("dtype"))),
            ]
            for name in names
        ]


ROW_HEADERS = ["module", "with grad", "lost", "update ratio (median)", "state underflow", "max |W|", "dtype"]


def overview(updates: Sequence[UpdateStats]) -> UpdateOverview | None:
    """The measured steps merged (skipped ones counted apart); None when no applied step has modules."""
    measured = [u for u in updates if u.by_module and not u.skipped]
    if not measured:
        return None
    merged = measured[0]
    for u in measured[1:]:
        merged = merged.merged(u)
    ratios: dict[str, list[float]] = {}
    from_zeros: set[str] = set()
    first_made_nonfinite = next(
        (u.step for u in measured if any(r["made_nonfinite"] for r in u.by_module.values())), None
    )
    for u in measured:
        for m, r in u.by_module.items():
            if r["numel_with_grad"] and not math.isnan(r["update_ratio"]):
                ratios.setdefault(m, []).append(r["update_ratio"])
            if r["numel"] and r["sq_weight"] == 0:
                from_zeros.add(m)
    skipped = sum(u.skipped for u in updates)
    return UpdateOverview(len(measured), skipped, merged, ratios, frozenset(from_zeros), first_made_nonfinite)


def update_verdicts(updates: Sequence[UpdateStats] | UpdateOverview | None) -> list[UpdateVerdict]:
    """The verdicts of the measured steps (module docstring: the thresholds), worst modules first; skipped steps
    left out."""
    seen = updates if isinstance(updates, UpdateOverview) or updates is None else overview(updates)
    if seen is None:
        return []
    modules = seen.merged.by_module
    steps = seen.steps_text
    verdicts: list[UpdateVerdict] = []

    made = sorted((m for m, r in modules.items() if r["made_nonfinite"]), key=lambda m: -modules[m]["made_nonfinite"])
    if made:
        count = sum(modules[m]["made_nonfinite"] for m in made)
        when = f"first on step {seen.first_made_nonfinite}; " if seen.first_made_nonfinite is not None else ""
        underflowing = [m for m in made if modules[m]["state_underflow"]]
        cause = (
            f"in {_named(underflowing)} Adam's exp_avg_sq is zero or subnormal, so the step divided by eps alone; keep "
            "the optimizer state in fp32, or raise eps (the exp_avg_sq line says how far)"
            if underflowing
            else "an update went past the largest value of the weights' dtype or divided by a zero denominator; keep "
            "fp32 master weights, lower the learning rate or raise the optimizer's eps"
        )
        verdicts.append(
            UpdateVerdict(
                "optimizer-made-nonfinite",
                f"the optimizer step itself turned {count:,} finite weights NaN/Inf in {len(made)} "
                f"module{'s' if len(made) != 1 else ''} ({_named(made)}) whose gradients were finite ({when}over "
                f"{steps}), so the NaN/Inf of every later step starts there",
                cause,
                "error",
            )
        )

    # An fp32 module of which nothing changed at all was not rounded: it did not step (lr 0, frozen): the ratio's.
    lossy = sorted(
        (
            m
            for m, r in modules.items()
            if r["numel_with_grad"]
            and r["lost_fraction"] >= LOST_THRESHOLD
            and not (r.get("dtype") == "fp32" and r["changed"] == 0)
        ),
        key=lambda m: -modules[m]["lost_fraction"],
    )
    if lossy:
        lost = sum(modules[m]["lost"] for m in lossy)
        with_grad = sum(modules[m]["numel_with_grad"] for m in lossy)
        dtype = _dtypes((modules[m] for m in lossy), "dtype")
        worst = ", ".join(f"{shown_name(m)} {modules[m]['lost_fraction']:.0%}" for m in lossy[:MAX_NAMED])
        why = f"{dtype} weights without a master copy" if dtype in ("bf16", "fp16") else f"{dtype} weights"
        # Master weights are the fix where a lossy module holds a 16-bit (or mixed) parameter; fp32 weights lose an
        # update only below 2^-24 of the weight, so there the steps themselves are too small.
        sixteen_bit = any(modules[m].get("dtype") != "fp32" for m in lossy)
        fix = (
            "keep fp32 master weights (the model in fp32 under autocast, or a mixed-precision optimizer), or use "
            "compensated or stochastic rounding (e.g. torchao's bf16 stochastic-rounding optimizers, "
            "torchao.optim with bf16_stochastic_round=True), or a larger learning rate for those modules"
            if sixteen_bit
            else "fp32 weights round away only a step below 2^-24 of the weight: the learning rate of those modules "
            "is far too small for their weights (or their gradients vanish under an optimizer that scales by them, "
            "such as SGD); raise it"
        )
        verdicts.append(
            UpdateVerdict(
                "updates-rounded-away",
                f"{lost / with_grad:.0%} of the updates of {len(lossy)} module{'s' if len(lossy) != 1 else ''} were "
                f"rounded away ({why}; over {steps}; worst: {worst})",
                fix,
            )
        )

    underflow = sorted(
        (
            m
            for m, r in modules.items()
            if r["numel_with_grad"] and r["state_underflow"] / r["numel_with_grad"] >= STATE_UNDERFLOW_THRESHOLD
        ),
        key=lambda m: -modules[m]["state_underflow"] / modules[m]["numel_with_grad"],
    )
    if underflow:
        state = _dtypes((modules[m] for m in underflow), "state_dtype")
        fraction = sum(modules[m]["state_underflow"] for m in underflow) / sum(
            modules[m]["numel_with_grad"] for m in underflow
        )
        eps = (
            "; with fp16 state raise eps to about 1e-4 (the default 1e-8 is below fp16's smallest subnormal, 6e-8, "
            "and rounds to 0 there)"
            if "fp16" in state.split("/")
            else "; or raise eps so that m / eps stays small"
        )
        verdicts.append(
            UpdateVerdict(
                "optimizer-state-underflow",
                f"Adam's second moment (exp_avg_sq, {state}) is zero or subnormal for {fraction:.1%} of the "
                f"elements with gradients in {len(underflow)} module{'s' if len(underflow) != 1 else ''} "
                f"({_named(underflow)}; over {steps}): their step is m / eps",
                "keep the optimizer state in fp32 (fp32 master weights and optimizer, or bf16, with fp32's "
                f"range){eps}",
            )
        )

    median = seen.median_ratio
    # A module whose weights are (or were made) NaN/Inf has no ratio worth a verdict: the weights finding tells it
    # (a LayerNorm weight gone from 1.0 to Inf is not "not training").
    broken = {m for m, r in modules.items() if r.get("made_nonfinite") or r.get("weight_nonfinite")}
    high = sorted(
        (m for m, v in median.items() if v > RATIO_HIGH and m not in seen.from_zeros and m not in broken),
        key=lambda m: -median[m],
    )
    zero = [m for m, v in seen.ratios.items() if max(v) == 0 and m not in lossy and m not in broken]
    zero += [m for m, r in modules.items() if r["numel"] and r.get(LR_ZERO_FIELD) == r["numel"] and m not in zero]
    if high or zero:
        parts = []
        if high:
            worst = ", ".join(f"{shown_name(m)} {median[m]:.1e}" for m in high[:MAX_NAMED])
            more = f" and {len(high) - MAX_NAMED} more" if len(high) > MAX_NAMED else ""
            parts.append(f"above {RATIO_HIGH:g} (median per step) in {len(high)} modules ({worst}{more})")
        if zero:
            parts.append(f"exactly 0 on every measured step in {len(zero)} modules with gradients ({_named(zero)})")
        verdicts.append(
            UpdateVerdict(
                "update-ratio",
                f"the update-to-weight ratio ||dW|| / ||W|| is {' and '.join(parts)}; about {RATIO_HEALTHY:g} per "
                f"step is the commonly quoted healthy value (over {steps})",
                "above it, lower the learning rate of those modules (or warm it up); at 0, check that their "
                "parameters are in the optimizer and that their learning rate is not 0",
                "info",
            )
        )
    return verdicts


def from_log(records: Iterable[Mapping[str, Any]]) -> list[UpdateStats]:
    """The update statistics of every record of a run log that carries them, in order."""
    return [UpdateStats.from_record(r["update"], r.get("step")) for r in records if r.get("update")]
