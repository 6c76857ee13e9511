"""Gradient spikes: steps whose total gradient norm jumps far above its recent level.

A **spike** is an inspected step whose total gradient norm (unscaled, finite) is more than ``SPIKE_FACTOR`` times
the median of the up to ``SPIKE_WINDOW`` finite norms before it (at least ``SPIKE_MIN_HISTORY`` of them). The
median, not the mean or the last value, so one earlier spike does not hide the next and normal step-to-step noise
(a factor of 2 or 3) never counts. Non-finite steps are not spikes: they are skipped or poisoned steps, reported as
such. bf16 runs get spikes too: nothing overflows there, so a spike is often the only sign of trouble.

Torch-free: the history, the run-log summary and the console share it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SPIKE_FACTOR = 10.0  # a total norm this many times its recent median is a spike
SPIKE_WINDOW = 10  # the recent median is over up to this many earlier finite norms
SPIKE_MIN_HISTORY = 3  # fewer earlier finite norms than this: no median to judge against
SPIKE_MODULES = 3  # modules named per spike


@dataclass(frozen=True)
class Spike:
    """A spike at ``step``: ``norm`` is ``factor`` times ``median`` (the recent median); ``rose`` names the modules
    whose gradient norm rose most against their own recent median (module, ratio > 1), when per-module norms are
    known."""

    step: int
    norm: float
    median: float
    factor: float
    rose: list[tuple[str, float]] = field(default_factory=list)

    def __str__(self) -> str:
        text = (
            f"gradient spike at step {self.step}: total norm {self.norm:.3g}, {self.factor:.3g}x the median "
            f"{self.median:.3g} of the steps before"
        )
        if self.rose:
            text += "; rose most: " + ", ".join(f"{m} (x{r:.3g})" for m, r in self.rose)
        return text


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def is_spike(norm: float, earlier: Sequence[float], factor: float = SPIKE_FACTOR) -> float | None:
    """The factor by which ``norm`` exceeds the median of ``earlier``'s last SPIKE_WINDOW finite values when that is
    a spike, else None."""
    recent = [x for x in earlier if math.isfinite(x)][-SPIKE_WINDOW:]
    if not math.isfinite(norm) or len(recent) < SPIKE_MIN_HISTORY:
        return None
    median = _median(recent)
    if median <= 0:
        return None
    ratio = norm / median
    return ratio if ratio > factor else None


def rose_most(
    now: Mapping[str, float | None],
    earlier: Sequence[Mapping[str, float | None] | None],
    limit: int = SPIKE_MODULES,
) -> list[tuple[str, float]]:
    """The modules whose gradient norm grew most from its median over its last SPIKE_WINDOW known values in
    ``earlier`` to ``now`` (ratio), unknown values left out. Against the recent median, not the step before, for the
    same reason the total norm is: right after a spike the step before is the spike, and every module would seem to
    fall. Only growth counts (ratio > 1): a module whose norm fell did not rise."""
    ratios = []
    for name, value in now.items():
        if value is None or not math.isfinite(value):
            continue
        # The last SPIKE_WINDOW known values, as the total norm's median takes its last finite ones (a NaN step in
        # the window is passed over, not counted short).
        olds = [v for m in earlier if m and (v := m.get(name)) is not None and math.isfinite(v)][-SPIKE_WINDOW:]
        if not olds:
            continue
        old = _median(olds)  # type: ignore[arg-type]
        if old > 0 and value > old:
            ratios.append((name, value / old))
    return sorted(ratios, key=lambda kv: -kv[1])[:limit]


def find_spikes(
    steps: Sequence[int],
    norms: Sequence[float],
    module_norms: Sequence[Mapping[str, float | None] | None] | None = None,
    factor: float = SPIKE_FACTOR,
) -> list[Spike]:
    """The spikes of a run: ``norms[i]`` is step ``steps[i]``'s total norm; ``module_norms[i]`` its per-module norms
    (None where unknown)."""
    found = []
    for i, norm in enumerate(norms):
        ratio = is_spike(norm, norms[:i], factor)
        if ratio is None:
            continue
        rose: list[tuple[str, float]] = []
        if module_norms is not None and i > 0 and module_norms[i] is not None:
            rose = rose_most(module_norms[i], module_norms[:i])
        found.append(Spike(int(steps[i]), float(norm), float(norm / ratio), ratio, rose))
    return found
