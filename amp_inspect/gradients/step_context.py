"""What a step's report learns beside its gradients, from watching the model: the order autograd made the
modules' gradients in (model/backward_order.py: the blame of a skipped step) and the autocast dtype the forward ran
under (model/autocast_watch.py), which also picks the formats to judge against when ``formats=`` was left to its
default: a bf16 run is judged against bf16 (under bf16 autocast, or without autocast a model whose weights are
mostly bf16), unless an enabled GradScaler is attached (a loss scale is fp16's tool, and its headroom is judged
against fp16). Both watches remove their hooks once they have seen enough.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from amp_inspect.core.formats import FORMAT_BOUNDS
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.model.autocast_watch import AUTOCAST_OFF, AutocastWatch
from amp_inspect.model.backward_order import BackwardOrder
from amp_inspect.model.view import ModelView

LOW_PRECISION = (torch.bfloat16, torch.float16)  # weights of these dtypes make gradients of them, autocast or not


class StepContext:
    """The two watches on the model of ``view`` (its parameters at attach); ``follow_autocast``: formats= was left
    out."""

    def __init__(self, view: nn.Module | ModelView, follow_autocast: bool) -> None:
        self._view = view = ModelView.of(view)
        self._follow = follow_autocast
        self._weights_format: str | None = None  # the format of the weights' dtype, once a forward ran off autocast
        self._order = BackwardOrder((e.param, e.module) for e in view.entries)
        device = view.device
        device_type = device.type if device is not None else "cpu"
        self._autocast = AutocastWatch(view.root, "cuda" if device_type == "meta" else device_type)

    def formats_to_judge(self, formats: tuple[str, ...], scaler: torch.amp.GradScaler | None) -> tuple[str, ...] | None:
        """``formats`` with the autocast dtype's format first, when it should follow the run and is not first
        yet; None when they stay as they are."""
        seen = self._autocast.seen
        if seen == AUTOCAST_OFF and self._follow:
            seen = self._weights_dtype_format()  # a model cast to bf16 runs bf16 without autocast
        if not self._follow or seen in (None, AUTOCAST_OFF) or formats[0] == seen:
            return None
        if scaler is not None and scaler.is_enabled():
            return None
        return (seen, *(f for f in formats if f != seen))

    def _weights_dtype_format(self) -> str:
        """The format of the dtype that holds most of the parameters' elements ("bf16" for ``model.to(bfloat16)``,
        whose gradients are bf16), AUTOCAST_OFF for float32 or another dtype; read once (the forward ran, the
        weights have their training dtype)."""
        if self._weights_format is None:
            dtype = self._view.dtype
            names = {b.dtype: name for name, b in FORMAT_BOUNDS.items()}
            self._weights_format = names.get(dtype, AUTOCAST_OFF) if dtype in LOW_PRECISION else AUTOCAST_OFF
        return self._weights_format

    # The Probe protocol (probes/probe.py): its part of each report, nothing at a step's end, its hooks at close.

    def annotate(self, report: StepReport) -> dict[str, Any]:
        """``report``'s part: the backward order (of the first backward) and the autocast dtype seen."""
        part = {"backward_order": self._order.take(), "autocast": self._autocast.seen}
        self._autocast.settle()
        return part

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool = False) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        """Removes both watches' hooks."""
        self._order.remove()
        self._autocast.remove()
