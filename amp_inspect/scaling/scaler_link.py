"""An inspector's link to its scaler (``ScalerLink``): an InspectingGradScaler reports to it; from a plain
torch.amp.GradScaler it learns what it needs by wrapping two of its methods, and which gradients that scaler
has unscaled in the step now running.

- ``unscale_``: which parameters each ``unscale_(optimizer)`` covers, so that with several optimizers on one
  scaler a check() between their unscale_ calls judges each gradient in the right picture.
- ``_maybe_opt_step`` (with ``every`` > 1): GradScaler reads its found_inf flags to the host before it decides
  to skip (one sync it makes anyway); the wrapper reads them at the same point and calls back on a skip, so a
  skipped step between inspected steps still gets full statistics.

Several inspectors may wrap the same scaler: each owns its own wrappers only, and removing them never takes
another inspector's away. GradScaler's private state read here: ``_per_optimizer_states`` (each optimizer's
stage) and ``_maybe_opt_step`` (where it decides to skip), the places torch keeps them (core/torch_compat.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from amp_inspect.core.torch_compat import optimizer_states
from amp_inspect.scaling.scaler import InspectingGradScaler, ScalerListener


def unscaled_optimizers(scaler: torch.amp.GradScaler) -> set[int]:
    """ids of the optimizers whose gradients scaler.unscale_ already unscaled this step."""
    states = optimizer_states(scaler)
    return {key for key, state in states.items() if state.get("stage") is OptState.UNSCALED}


class GradScalerPatches:
    """One inspector's wrappers on plain GradScalers, and the unscale_ calls they recorded."""

    def __init__(self) -> None:
        self.unscaled_params: dict[int, set[int]] = {}  # optimizer id -> parameter ids its unscale_ covers
        self._patched: list[tuple[object, str, Any]] = []

    def record_unscales(self, scaler: torch.amp.GradScaler) -> None:
        def unscale_(original: Callable[..., Any], optimizer: torch.optim.Optimizer) -> None:
            params = {id(p) for group in optimizer.param_groups for p in group["params"]}
            self.unscaled_params[id(optimizer)] = params
            original(optimizer)

        self._patch(scaler, "unscale_", unscale_)

    def call_on_skip(self, scaler: torch.amp.GradScaler, on_skip: Callable[[], None]) -> None:
        """Calls ``on_skip()`` when ``scaler`` is about to skip an optimizer's step on NaN/Inf."""

        def maybe_opt_step(original: Callable[..., Any], optimizer, optimizer_state, *args: Any, **kwargs: Any):
            if sum(v.item() for v in optimizer_state["found_inf_per_device"].values()):
                on_skip()
            return original(optimizer, optimizer_state, *args, **kwargs)

        self._patch(scaler, "_maybe_opt_step", maybe_opt_step)

    def unscaled(self, scaler: torch.amp.GradScaler, params: Sequence[torch.Tensor]) -> list[bool]:
        """Whether each of ``params``' gradients is unscaled already in the step now running."""
        done = unscaled_optimizers(scaler)
        if not done:
            return [False] * len(params)
        known = [self.unscaled_params.get(key) for key in done]
        if any(ids is None for ids in known):  # unscale_ ran before attach (or unwatched): assume all of them
            return [True] * len(params)
        ids = set().union(*known)
        return [id(p) in ids for p in params]

    def _patch(self, obj: object, attr: str, body: Callable[..., Any]) -> None:
        """Wraps ``obj.attr`` in an instance attribute that calls ``body(original, *args)``."""
        original = getattr(obj, attr)

        def patched(*args: Any, **kwargs: Any) -> Any:
            if patched.active:  # type: ignore[attr-defined]
                return body(original, *args, **kwargs)
            return original(*args, **kwargs)

        patched.active = True  # type: ignore[attr-defined]
        patched.previous = vars(obj).get(attr)  # type: ignore[attr-defined]  # None: the class's own method
        setattr(obj, attr, patched)
        self._patched.append((obj, attr, patched))

    def remove(self) -> None:
        """Turns these wrappers into pass-throughs and removes those on top; a wrapper another inspector put on
        top of ours stays (it calls through ours, which now only passes on)."""
        for obj, attr, patched in reversed(self._patched):
            patched.active = False
            if vars(obj).get(attr) is not patched:
                continue
            below = patched.previous
            while below is not None and getattr(below, "active", True) is False:
                below = below.previous  # other detached inspectors' pass-throughs go too
            if below is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, below)
        self._patched.clear()


class ScalerLink:
    """A listener's link to its scaler: an InspectingGradScaler reports to it (``set_listener``); a plain
    GradScaler gets the wrappers above. One scaler at a time; ``link`` again with the same one does nothing."""

    def __init__(self) -> None:
        self.scaler: torch.amp.GradScaler | None = None
        self.patches = GradScalerPatches()

    @staticmethod
    def refuse_taken(scaler: torch.amp.GradScaler | None, listener: object) -> None:
        """RuntimeError when ``scaler`` is an InspectingGradScaler that reports to another listener."""
        if isinstance(scaler, InspectingGradScaler) and scaler.listener not in (None, listener):
            raise RuntimeError(
                "this InspectingGradScaler already has an inspector attached (it reports to one); detach() that one "
                "first, or attach this one to a plain GradScaler"
            )

    def link(self, scaler: torch.amp.GradScaler, listener: ScalerListener, on_skip: Callable[[], None] | None) -> None:
        """Links ``scaler``; a plain one calls ``on_skip()`` (when given) before it skips a step on NaN/Inf."""
        if self.scaler is scaler:
            return
        self.refuse_taken(scaler, listener)
        self.scaler = scaler
        if isinstance(scaler, InspectingGradScaler):
            scaler.set_listener(listener)
            return
        self.patches.record_unscales(scaler)
        if on_skip is not None:
            self.patches.call_on_skip(scaler, on_skip)

    def unscaled(self, scaler: torch.amp.GradScaler, params: Sequence[torch.Tensor]) -> list[bool]:
        """Whether each of ``params``' gradients is unscaled already in the step now running (a plain scaler)."""
        return self.patches.unscaled(scaler, params)

    def remove(self, listener: ScalerListener) -> None:
        """Removes the wrappers; an InspectingGradScaler stops reporting to ``listener`` (not to another one)."""
        self.patches.remove()
        if isinstance(self.scaler, InspectingGradScaler):
            self.scaler.remove_listener(listener)
