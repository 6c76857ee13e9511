"""What ``attach()`` refuses, before it hooks anything, each with its one sentence: a scaler that is not a
GradScaler, ``watch_clipping`` without a scaler, an InspectingGradScaler that already reports to another
inspector, FSDP1 (wrappers.py), and a DDP model with sparse gradients under the comm hook or with a ``group``
other than its own (ddp.py). (A model that is not an nn.Module is refused first, by the Inspector itself.)

Cost: a walk over the model's modules (FSDP1, sparse embeddings), no tensor data read.
"""

from __future__ import annotations

import torch
from torch import nn

from .ddp import check_attach
from .gradscaler_patches import ScalerLink
from .options import AttachOptions
from .wrappers import refuse_fsdp1


def refuse_bad_attach(model: nn.Module, scaler: object, options: AttachOptions, listener: object) -> None:
    """Raises TypeError, ValueError or RuntimeError when ``listener`` (the inspector being made) cannot attach to
    ``model`` (an nn.Module) and ``scaler`` with ``options``; returns None when it can."""
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if options.watch_clipping and scaler is None:
        raise ValueError("watch_clipping needs the scaler: attach(model, scaler, watch_clipping=True)")
    ScalerLink.refuse_taken(scaler, listener)
    refuse_fsdp1(model)
    check_attach(model, options.group, options.ddp_hook)
