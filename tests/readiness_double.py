"""TEST DOUBLE, while amp_inspect/readiness.py (helper rcpu) is not merged: a ``format_readiness`` with the
contract's ReadinessStats fields, made from the float64 reference. Used only where the real one is missing."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from amp_inspect.recipes import RECIPE_NAMES, check_recipes
from amp_inspect.reference_readiness import format_readiness_reference


@dataclass(frozen=True)
class DoubleReadinessStats:
    recipes: tuple[str, ...]
    numel: torch.Tensor
    nonzero: torch.Tensor
    nonfinite: torch.Tensor
    flushed: torch.Tensor
    saturated: torch.Tensor
    blocks: torch.Tensor
    scale_flushed: torch.Tensor
    sq_error: torch.Tensor
    sq_signal: torch.Tensor
    amax: torch.Tensor


def double_format_readiness(tensors, recipes=None, *, tensor_amax=None):
    names = check_recipes(recipes)
    counts, sums, amax = format_readiness_reference(list(tensors), [RECIPE_NAMES.index(n) for n in names], tensor_amax)
    r = len(names)

    def per(k: int) -> torch.Tensor:
        return counts[:, 3 + k :: 4][:, :r]

    def rep(col: torch.Tensor) -> torch.Tensor:
        return col[:, None].expand(-1, r)

    return DoubleReadinessStats(
        names,
        rep(counts[:, 0]),
        rep(counts[:, 1]),
        rep(counts[:, 2]),
        per(0),
        per(1),
        per(2),
        per(3),
        sums[:, 1:],
        rep(sums[:, 0]),
        amax,
    )


def real_or_double():
    try:
        from amp_inspect.readiness import format_readiness
    except ImportError:
        return double_format_readiness
    return format_readiness
