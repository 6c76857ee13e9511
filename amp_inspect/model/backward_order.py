"""The order in which autograd makes the gradients of a model's modules: closest to the output first.

Recorded once per model, on the first backward after attach: a post-accumulate-grad hook on every parameter
appends its module's name the first time one of its gradients is ready, and the hooks are removed when the order
is taken (``take``). The blame for a skipped step (amp_inspect/evidence/attribution.py) reads it: of the modules whose
gradients hold NaN/Inf, the one autograd computed first is where the NaN started; the others received it.

Cost: one Python call per parameter in the first backward only; no device work, no sync.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.utils.hooks import RemovableHandle


class BackwardOrder:
    """Records module names in the order their parameters' gradients become ready (see the module docstring)."""

    def __init__(self, params: Iterable[tuple[torch.Tensor, str]]) -> None:
        self._order: dict[str, None] = {}
        self._handles: list[RemovableHandle] = []
        self._taken: tuple[str, ...] | None = None
        for param, module in params:
            if not param.requires_grad or not hasattr(param, "register_post_accumulate_grad_hook"):
                continue
            try:
                self._handles.append(param.register_post_accumulate_grad_hook(self._hook(module)))
            except RuntimeError:  # a parameter that cannot carry the hook (not a leaf): its module goes unordered
                continue

    def _hook(self, module: str):
        def ready(_: torch.Tensor) -> None:
            self._order.setdefault(module)

        return ready

    def take(self) -> tuple[str, ...]:
        """The order seen so far; once a backward has been seen, it is final and the hooks are removed."""
        if self._taken is not None:
            return self._taken
        if not self._order:
            return ()
        self._taken = tuple(self._order)
        self.remove()
        return self._taken

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
