"""Clipping scaled gradients, seen while it happens: ``watch_clipping(scaler)`` wraps
``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_`` until closed and records each call made on gradients
still scaled by the loss scale; ``doctor(..., clip_watch=watch)`` reports what it saw (ClipWatch.findings).

A runtime probe like amp_inspect/probes/activations.py: it patches torch's functions while open and puts them back on
``close()``. See ClipWatch for what counts and what it costs.
"""

from __future__ import annotations

import functools
import os
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.amp.grad_scaler import OptState

from amp_inspect.core.printable import plural
from amp_inspect.core.torch_compat import loss_scale_tensor, optimizer_states

CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_")


def _clip_modules() -> tuple[types.ModuleType, ...]:
    import torch.nn.utils
    import torch.nn.utils.clip_grad

    return (torch.nn.utils, torch.nn.utils.clip_grad)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # with the separator: not torchvision


def _call_site() -> str:
    """file:line of the first caller outside this module and torch (a few frame hops; no I/O)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(_TORCH_DIR)
    ):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@dataclass(frozen=True)
class ScaledClip:
    """Evidence: torch's clipping ran at ``where`` on gradients still scaled by ``scale`` (not 1)."""

    function: str  # "clip_grad_norm_" or "clip_grad_value_"
    where: str  # the call site, "file:line"
    calls: int
    scale: float


@dataclass
class _ClipSite:
    function: str
    where: str
    calls: int
    scale: torch.Tensor  # a copy of the loss scale at the last call
    not_one: torch.Tensor  # bool tensor: some call saw a scale other than 1


class ClipWatch:
    """Watches ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` for calls on gradients still scaled by
    ``scaler``: after ``scaler.scale(loss)``, before ``scaler.unscale_(optimizer)``. Use ``watch_clipping``.

    The gradients count as scaled when the scaler is enabled, has scaled a loss, and the optimizer that owns the
    clipped parameters is still in GradScaler's READY stage (neither unscale_ nor step ran since update). Pass
    ``optimizers`` to tell owners apart; without it, any optimizer already unscaled this step clears the call.
    GradScaler's state does not tell "after update()" from "after the next scale(loss)", so a clip between
    update() and the next backward counts too (it acts on the last step's spent gradients: nobody clips there).

    Calls made through a name bound before the watch started (``from torch.nn.utils import clip_grad_norm_`` at
    import time) are not seen: the watch replaces the functions in torch.nn.utils and torch.nn.utils.clip_grad.

    Cost per watched call: a look at the scaler's state, one frame walk and a copy of the scale tensor (async,
    no sync). ``findings`` reads the recorded scales (one sync on CUDA). ``close()`` puts the originals back; it
    runs on leaving a ``with`` block, exception or not, and is safe to call twice.
    """

    def __init__(
        self,
        scaler: torch.amp.GradScaler,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    ) -> None:
        if not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"watch_clipping needs a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler
        if isinstance(optimizers, torch.optim.Optimizer):
            optimizers = [optimizers]
        self.optimizers: list[torch.optim.Optimizer] = list(optimizers or [])
        self.closed = False
        self._sites: dict[tuple[str, str], _ClipSite] = {}
        self._patches: list[tuple[types.ModuleType, str, Callable, Callable]] = []
        self._warned = False
        try:
            self._install()
        except BaseException:
            self.close()
            raise

    def _install(self) -> None:
        wrappers: dict[int, Callable] = {}  # one wrapper per function object (both modules hold the same one)
        for module in _clip_modules():
            for name in CLIP_FUNCTIONS:
                original = getattr(module, name)
                wrapper = wrappers.get(id(original))
                if wrapper is None:
                    wrapper = wrappers[id(original)] = self._wrap(name, original)
                setattr(module, name, wrapper)
                self._patches.append((module, name, original, wrapper))

    def _wrap(self, name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def watched(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.closed:
                parameters = self._observe(name, parameters)
            return original(parameters, *args, **kwargs)

        watched._amp_inspect_clip_watch = self  # type: ignore[attr-defined]
        return watched

    def _observe(self, name: str, parameters: Any) -> Any:
        """Records the call when the gradients are scaled; returns ``parameters`` ready to pass on (an iterator
        is read once here, so the original gets a fresh one over the same parameters)."""
        if isinstance(parameters, torch.Tensor):
            params, passed = [parameters], parameters
        else:
            params = list(parameters)
            if isinstance(parameters, types.GeneratorType):
                passed = (p for p in params)  # keeps torch's empty-generator warning
            elif isinstance(parameters, Iterator):
                passed = params
            else:
                passed = parameters
        try:
            if self._grads_scaled(params):
                self._record(name)
        except Exception as error:  # a watch must never break the training step it watches
            if not self._warned:
                self._warned = True
                warnings.warn(f"amp_inspect: watch_clipping could not inspect a call ({error!r})", stacklevel=3)
        return passed

    def _grads_scaled(self, params: list[torch.Tensor]) -> bool:
        scaler = self.scaler
        if not scaler.is_enabled() or loss_scale_tensor(scaler) is None:
            return False  # no loss was ever scaled
        states = optimizer_states(scaler)  # .get below: reading must not add entries to the defaultdict

        def ready(optimizer_id: int) -> bool:
            state = states.get(optimizer_id)
            return state is None or state["stage"] is OptState.READY

        if self.optimizers:
            clipped = {id(p) for p in params}
            owners = [
                opt
                for opt in self.optimizers
                if any(id(p) in clipped for group in opt.param_groups for p in group["params"])
            ]
            return any(ready(id(opt)) for opt in owners or self.optimizers)
        return all(ready(key) for key in states)

    def _record(self, name: str) -> None:
        where = _call_site()
        scale = loss_scale_tensor(self.scaler)
        assert scale is not None  # _grads_scaled saw it
        scale = scale.detach().clone()  # async; update() changes the scale tensor in place
        site = self._sites.get((name, where))
        if site is None:
            self._sites[(name, where)] = _ClipSite(name, where, 1, scale, scale != 1)
        else:
            site.calls += 1
            site.scale = scale
            site.not_one = site.not_one | (scale != 1)

    @property
    def calls(self) -> int:
        """Watched calls made on scaled gradients so far (any scale)."""
        return sum(site.calls for site in self._sites.values())

    @property
    def scaled_clips(self) -> list[ScaledClip]:
        """One entry per call site that clipped scaled gradients at a scale other than 1 (syncs once on CUDA);
        the doctor's clipping check (diagnosis/setup_checks.py) words them."""
        return [
            ScaledClip(site.function, site.where, site.calls, float(site.scale))
            for site in self._sites.values()
            if bool(site.not_one)
        ]

    def close(self) -> None:
        """Puts the original functions back (those this watch replaced and nobody replaced since). Idempotent."""
        self.closed = True
        for module, name, original, wrapper in reversed(self._patches):
            if getattr(module, name, None) is not wrapper:
                continue  # replaced again since (another watch): that one restores, and ours passes through
            while getattr(getattr(original, "_amp_inspect_clip_watch", None), "closed", False):
                original = original.__wrapped__  # an older watch closed meanwhile: skip its wrapper
            setattr(module, name, original)
        self._patches.clear()

    def __enter__(self) -> ClipWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"ClipWatch({type(self.scaler).__name__}, {plural(self.calls, 'call')} on scaled gradients) [{state}]"


def watch_clipping(
    scaler: torch.amp.GradScaler,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
) -> ClipWatch:
    """Starts watching torch's gradient clipping for calls on gradients still scaled by ``scaler``.

        with watch_clipping(scaler, optimizer) as watch:
            train_a_few_steps()
        print(doctor(model, optimizer, scaler, clip_watch=watch))

    Or keep the handle and ``watch.close()`` when done. See ClipWatch for what counts and what it costs."""
    return ClipWatch(scaler, optimizers)
