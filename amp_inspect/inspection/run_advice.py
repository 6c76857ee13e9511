"""What an inspector says about the run so far, on request: ``summary()`` (the history's rates, events and
advice, phrased against the linked scaler's settings) and ``doctor()`` (the setup checks on the model, the
scaler, the history and, when ``watch_clipping=True``, the clip watch this module holds for them).

Nothing here runs during a step: the clip watch records clip_grad_norm_ calls while it is open, and the rest
reads the history when asked (reading it waits for outstanding device copies).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from amp_inspect.diagnosis.doctor import ClipWatch, DoctorReport, doctor
from amp_inspect.diagnosis.history import StepRecord, Summary, summarize
from amp_inspect.diagnosis.setup_checks import (
    scaler_settings,  # the doctor's scaler advice is phrased against the same settings
)
from amp_inspect.model.view import ModelView

SEEN_DTYPES = ("fp16", "bf16")  # the autocast formats a history records that name a dtype (not "off")


class RunAdvice:
    """One inspector's summary and doctor; ``watch_clipping``: hold a ClipWatch on ``scaler`` for the doctor."""

    def __init__(
        self, view: ModelView, scaler: torch.amp.GradScaler | None, watch_clipping: bool, collapse_skips: int
    ) -> None:
        self.view, self.collapse_skips = view, collapse_skips
        # Opt-in: record clip_grad_norm_ calls made while the gradients are still scaled (doctor()).
        self.clip_watch: ClipWatch | None = ClipWatch(scaler) if watch_clipping else None

    def summary(self, history: list[StepRecord], scaler: torch.amp.GradScaler | None) -> Summary:
        """Skip rate, scale events and advice on ``scaler``'s settings, from ``history``."""
        return summarize(history, collapse_skips=self.collapse_skips, **scaler_settings(scaler))

    def doctor(
        self,
        history: Sequence[StepRecord],
        scaler: torch.amp.GradScaler | None,
        optimizer: torch.optim.Optimizer | None,
        autocast_dtype: Any,
    ) -> DoctorReport:
        """The AMP doctor on the model, ``scaler``, ``history`` and the clip watch (when on). Without
        ``autocast_dtype``, the autocast dtype the run's forward passes were seen under (the same verdicts as
        ``amp_inspect.doctor(..., autocast_dtype=...)`` given that dtype)."""
        self.view.refresh()  # one named_parameters pass; a walk only where the model changed
        if autocast_dtype is None:
            autocast_dtype = next((r.autocast for r in reversed(history) if r.autocast in SEEN_DTYPES), None)
        return doctor(
            self.view,
            optimizer,
            scaler,
            autocast_dtype=autocast_dtype,
            history=history,
            clip_watch=self.clip_watch,
            collapse_skips=self.collapse_skips,
        )

    def close(self) -> None:
        """Stops the clip watch (idempotent)."""
        if self.clip_watch is not None:
            self.clip_watch.close()
