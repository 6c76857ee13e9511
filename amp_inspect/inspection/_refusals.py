"""What ``attach()`` refuses, before it hooks anything, each with its one sentence: a scaler that is not a
GradScaler, ``watch_clipping`` without a scaler, an InspectingGradScaler that already reports to another
inspector, FSDP1 (model/wrappers.py), and a DDP model with sparse gradients under the comm hook or with a ``group``
other than its own (distributed/ddp.py). (A model that is not an nn.Module is refused first, by the Inspector itself.)

Cost: none beyond the model's view (model/view.py), which holds the wrappers and sparse modules; no tensor data
read.
"""

from __future__ import annotations

import torch

from amp_inspect.distributed.ddp import check_attach
from amp_inspect.inspection.options import AttachOptions
from amp_inspect.model.view import ModelView
from amp_inspect.model.wrappers import refuse_fsdp1
from amp_inspect.scaling.scaler_link import ScalerLink


def refuse_bad_attach(view: ModelView, scaler: object, options: AttachOptions, listener: object) -> None:
    """Raises TypeError, ValueError or RuntimeError when ``listener`` (the inspector being made) cannot attach to
    the model of ``view`` and ``scaler`` with ``options``; returns None when it can."""
    if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if options.watch_clipping and scaler is None:
        raise ValueError("watch_clipping needs the scaler: attach(model, scaler, watch_clipping=True)")
    ScalerLink.refuse_taken(scaler, listener)
    refuse_fsdp1(view)
    check_attach(view, options.group, options.ddp_hook)
