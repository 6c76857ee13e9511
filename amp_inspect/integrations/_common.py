"""What the integrations share: the scalars of a report, the exponent histogram as buckets, and following an
Inspector's finalized reports. Imports no optional package.

Terms (report terms as in amp_inspect/gradients/step_report.py; "the first format" is the inspector's first format, fp16
by default):

- **Step scalars**: ``loss_scale`` (only with a scaler), ``skipped`` (1.0 when a gradient holds NaN/Inf and an
  enabled GradScaler skips the step), ``poisoned`` (only without an enabled scaler, e.g. bf16 runs: 1.0 when a
  gradient holds NaN/Inf, which nothing skips: the optimizer applies them),
  ``total_norm`` (unscaled), ``headroom_up`` / ``headroom_down`` and ``recommended_scale_log2`` (when
  defined, i.e. some gradient is finite and nonzero).
- **Module scalars**: ``overflow_frac`` / ``underflow_frac`` / ``subnormal_frac`` (counts of the first
  format over the module's gradient elements) and ``nonfinite`` (NaN and Inf elements) of a module.
- **Trouble** ranks modules: NaN/Inf elements first, then overflow, underflow, subnormal counts.
- **Exponent axis**: the histograms' x is log2 of the judged (scaled) magnitude, log2|v|: float32 exponent
  bin e (core/tensor_stats.py) is the binade [e - 127, e - 126). Bin 0 (zeros and float32 subnormals) is drawn as
  [-127, -126), bin 255 (NaN/Inf, no finite position) as [128, 129): past every finite float32 (log2 < 128),
  so its count stays visible and separate. On this axis the format's edges do not move with the loss scale
  (fp16 overflows from 16, underflows below -24); log2|g| of the unscaled gradient is x - log2(loss_scale).
- **Finalized report**: one whose statistics reached the host and that the Inspector put in its history.
  Reading it never waits for the device. On CPU a report is finalized in the check() that makes it; on CUDA
  normally in the next step's check(): the integrations log one step behind rather than sync the host.
"""

from __future__ import annotations

import importlib
import math
import warnings
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from amp_inspect.core.formats import EXPONENT_BIAS, HIST_BINS, NONFINITE_BIN
from amp_inspect.inspection.options import TRAINER_OPTIMIZER, AttachOptions

if TYPE_CHECKING:
    from amp_inspect.gradients.step_report import StepReport
    from amp_inspect.inspection.inspector import Inspector

PREFIX = "amp_inspect/"
ALL_MODULES = "(all)"  # the histogram of all modules together


def require(module: str, extra: str, integration: str, package: str | None = None) -> ModuleType:
    """Imports an optional package, or raises an ImportError that names the pip extra to install.

    Example::

        wandb = require("wandb", "wandb", "WandbLogger")
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"amp_inspect's {integration} needs the package {package or module!r} ({error}): "
            f"pip install amp_inspect[{extra}]"
        ) from error


def check_every(name: str, value: int, allow_zero: bool = False) -> int:
    """Validates a step interval (``log_every``, ``hist_every``)."""
    low = 0 if allow_zero else 1
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


def step_scalars(report: StepReport) -> dict[str, float]:
    """The step scalars of a report (see the module docstring), cheap: no per-module work.

    Example::

        step_scalars(report)  # {"loss_scale": 65536.0, "skipped": 0.0, "total_norm": 0.83, ...}
    """
    out: dict[str, float] = {}
    if report.scale is not None:
        out["loss_scale"] = float(report.scale)
    out["skipped"] = float(report.skipped)
    if not report.skips:  # no enabled GradScaler: a NaN/Inf step is applied, not skipped
        out["poisoned"] = float(report.poisoned)
    out["total_norm"] = float(report.total_norm)
    room = report.headroom
    if room.up is not None and room.down is not None:
        out["headroom_up"] = float(room.up)
        out["headroom_down"] = float(room.down)
    recommended = report.recommended_scale
    if recommended is not None:
        out["recommended_scale_log2"] = math.log2(recommended)
    return out


def _trouble(m: dict) -> tuple[int, int, int, int]:
    return (m["nan"] + m["posinf"] + m["neginf"], m["overflow"], m["underflow"], m["subnormal"])


def troubled_modules(report: StepReport, top: int) -> list[str]:
    """Up to ``top`` modules with any NaN/Inf, overflow, underflow or subnormal gradient, most trouble first."""
    modules = report.by_module
    troubled = [name for name, m in modules.items() if any(_trouble(m))]
    troubled.sort(key=lambda n: tuple(-x for x in _trouble(modules[n])))
    return troubled[:top]


def histogram_modules(report: StepReport, top: int) -> list[str]:
    """Up to ``top`` modules for histograms: the troubled ones first, then the largest (most elements)."""
    modules = report.by_module
    order = sorted(modules, key=lambda n: (tuple(-x for x in _trouble(modules[n])), -modules[n]["numel"]))
    return order[:top]


def module_scalars(report: StepReport, name: str) -> dict[str, float]:
    """``overflow_frac``, ``underflow_frac``, ``subnormal_frac`` and ``nonfinite`` of one module."""
    m = report.by_module[name]
    numel = max(m["numel"], 1)
    return {
        "overflow_frac": m["overflow"] / numel,
        "underflow_frac": m["underflow"] / numel,
        "subnormal_frac": m["subnormal"] / numel,
        "nonfinite": float(m["nan"] + m["posinf"] + m["neginf"]),
    }


def report_hist(report: StepReport, name: str) -> np.ndarray:
    """The 256-bin exponent histogram of a module, or of all modules for ``ALL_MODULES``."""
    if name == ALL_MODULES:
        total = np.zeros(HIST_BINS, dtype=np.int64)
        for module in report.by_module:
            total += report.module_hist(module)
        return total
    return report.module_hist(name)


def report_values(
    report: StepReport, *, scalars: bool, histograms: bool, top_modules: int
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """What the TensorBoard and wandb loggers write for a report: ({key: scalar}, {module: 256-bin histogram}),
    keys without the prefix. Scalars: the step scalars, ``nonfinite``, and the module scalars of up to
    ``top_modules`` troubled modules. Histograms: ``(all)`` and up to ``top_modules`` modules, each with its
    NaN/Inf count as the scalar ``nonfinite/<module>``."""
    values: dict[str, float] = {}
    hists: dict[str, np.ndarray] = {}
    if scalars:
        values.update(step_scalars(report))
        values["nonfinite"] = float(sum(m["nan"] + m["posinf"] + m["neginf"] for m in report.by_module.values()))
        for name in troubled_modules(report, top_modules):
            values.update({f"{key}/{name}": value for key, value in module_scalars(report, name).items()})
    if histograms:
        for name in [ALL_MODULES, *histogram_modules(report, top_modules)]:
            hists[name] = report_hist(report, name)
            values[f"nonfinite/{name}"] = float(hists[name][NONFINITE_BIN])
    return values, hists


def exponent_span(hist: np.ndarray) -> tuple[int, int] | None:
    """(first, last) nonzero bin of a 256-bin exponent histogram, or None when it is empty."""
    nonzero = np.flatnonzero(hist)
    if nonzero.size == 0:
        return None
    return int(nonzero[0]), int(nonzero[-1])


def exponent_edges(first: int, last: int) -> np.ndarray:
    """The log2|v| edges of bins first..last (one more edge than bins): bin e is [e - 127, e - 126)."""
    return np.arange(first, last + 2, dtype=np.float64) - EXPONENT_BIAS


class ReportFollower:
    """Follows an Inspector's finalized reports without waiting on the device: ``take()`` gives the newest
    one not taken yet (None when there is none) and the number of skipped steps among the reports finalized
    since the previous take (``poisoned_taken``: the poisoned ones, see amp_inspect/gradients/step_report.py).

    Example::

        follower = ReportFollower(insp)
        insp.check()
        report, skipped = follower.take()   # this step's report on CPU, normally the previous one on CUDA
    """

    def __init__(self, inspector: Inspector) -> None:
        self.latest: StepReport | None = None
        self._fresh = False
        self._skipped = 0
        self._poisoned = 0
        self.poisoned_taken = 0  # poisoned steps among the reports of the last take()
        on_finalized(inspector, self._receive)

    def _receive(self, report: StepReport) -> None:
        self.latest = report
        self._fresh = True
        self._skipped += int(report.skipped)
        self._poisoned += int(report.poisoned)

    def take(self) -> tuple[StepReport | None, int]:
        report = self.latest if self._fresh else None
        skipped, self._fresh, self._skipped = self._skipped, False, 0
        self.poisoned_taken, self._poisoned = self._poisoned, 0
        return report, skipped


def on_finalized(inspector: Inspector, sink: Callable[[StepReport], None]) -> None:
    """Calls ``sink(report)`` for each report ``inspector`` finalizes from now on (statistics on the host:
    reading the report does not wait). ``inspector.detach()`` removes the sinks: to deliver the reports still
    in flight first, read ``inspector.history`` (it waits for them) before detaching.

    Example::

        on_finalized(insp, lambda report: print(report.step, report.found_inf))
    """
    inspector.add_listener(sink)


def callback_options(options: dict[str, Any]) -> dict[str, Any]:
    """A callback's attach options: with ``update_every`` and no ``optimizer``, the trainer's (filled in at attach
    by ``attach_kwargs``)."""
    if options.get("update_every") is not None and options.get("optimizer") is None:
        return {**options, "optimizer": TRAINER_OPTIMIZER}
    return options


def attach_kwargs(options: AttachOptions, optimizers: object, given: Iterable[str]) -> dict[str, Any]:
    """The Inspector's keyword arguments of a callback's options, the trainer's ``optimizers`` where asked for.
    ``given``: the options the user passed. ``formats`` is passed on only when given: left out, the Inspector judges
    the gradients against the format of the autocast dtype the trainer runs (a bf16 run is not judged as fp16)."""
    kwargs = options.as_kwargs()
    if "formats" not in given:
        del kwargs["formats"]
    if kwargs.get("optimizer") == TRAINER_OPTIMIZER:
        kwargs["optimizer"] = optimizers
    return kwargs


class PoisonedCheckpointWarning(RuntimeWarning):
    """A checkpoint was saved from weights that hold NaN/Inf (warn_poisoned_checkpoint)."""


def warn_poisoned_checkpoint(inspector: Inspector, what: str) -> bool:
    """Warns (PoisonedCheckpointWarning, and on stderr through the warnings machinery) when ``inspector``'s weights
    hold NaN/Inf as ``what`` is saved, naming the step they became so and its origin where the run shows it;
    returns whether it warned."""
    message = inspector.checkpoint_warning()
    if message is None:
        return False
    warnings.warn(f"{what}: {message}", PoisonedCheckpointWarning, stacklevel=3)
    return True
