"""The AMP doctor (``amp_inspect.doctor``, defined here): checks a mixed-precision setup, a run's history and
the environment, and says how to fix what it finds.

    report = doctor(model, optimizer, scaler, autocast_dtype=torch.float16, history=insp.history)
    print(report)              # errors first, each with its fix
    if not report.ok: ...

Severities: an **error** is training that is wrong or silently degraded (fp16 weights stepped without fp32
master copies, fp16 autocast without a GradScaler, clipping gradients that are still scaled); a **warning** works
but wastes or risks something (sizes that keep tensor cores idle, a loss-scale collapse); an **info** is worth
knowing and may need nothing. ``report.ok``: no error and no warning.

Clipping scaled gradients can only be seen while it happens: ``watch_clipping(scaler)`` wraps
``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_`` until closed, and ``doctor(..., clip_watch=watch)``
reports what it saw.

Adding a check: a function that takes a ``Setup`` and yields ``Finding``s, decorated with ``@check`` (model,
optimizer, scaler, history) or ``@environment_check`` (the machine and the build).

Where the pieces live (all importable from here, ``from amp_inspect.diagnosis.doctor import Finding, check``): the
findings, the report and the registry in amp_inspect/diagnosis/findings.py; the setup checks in
amp_inspect/diagnosis/setup_checks.py; the environment checks and a run log's hardware findings in
amp_inspect/diagnosis/environment_checks.py; the clipping watch in amp_inspect/scaling/clipping.py; ``amp-inspect
doctor`` (also
``python -m amp_inspect doctor``) in amp_inspect/cli/commands.py. This module is not named ``doctor``: the package's
``amp_inspect.doctor`` is the function, and a submodule of that name would replace it when imported.

Cost: the setup checks walk parameters and modules once, reading no tensor data (no sync). Reading a
ClipWatch's findings reads the loss scales it recorded (one host sync on CUDA). The environment checks
initialise CUDA and NVML: they are for ``amp-inspect doctor``, not for the training loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from amp_inspect.diagnosis import findings
from amp_inspect.diagnosis.environment_checks import GPU_MEMORY_FULL, check_environment, log_hardware_findings
from amp_inspect.diagnosis.findings import (
    CHECKS,
    ENVIRONMENT_CHECKS,
    SEVERITIES,
    DoctorReport,
    Finding,
    check,
    environment_check,
)
from amp_inspect.diagnosis.history import COLLAPSE_SKIPS, StepRecord
from amp_inspect.diagnosis.setup_checks import IMAGE_CHANNELS_MAX, MAX_HEADROOM, TENSOR_CORE_MULTIPLE, CheckFn, Setup
from amp_inspect.model.view import ModelView
from amp_inspect.scaling.clipping import CLIP_FUNCTIONS, ClipWatch, watch_clipping

DEFAULT_COLLAPSE_SKIPS = COLLAPSE_SKIPS  # the name this module has always exported

__all__ = [
    "CHECKS",
    "CLIP_FUNCTIONS",
    "DEFAULT_COLLAPSE_SKIPS",
    "ENVIRONMENT_CHECKS",
    "GPU_MEMORY_FULL",
    "IMAGE_CHANNELS_MAX",
    "MAX_HEADROOM",
    "SEVERITIES",
    "TENSOR_CORE_MULTIPLE",
    "CheckFn",
    "ClipWatch",
    "DoctorReport",
    "Finding",
    "Setup",
    "check",
    "check_environment",
    "doctor",
    "environment_check",
    "log_hardware_findings",
    "watch_clipping",
]


def _autocast_in_effect() -> torch.dtype | None:
    """The dtype of the autocast region the caller is in (CUDA first, then CPU), or None outside one."""
    for device_type in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device_type):
                return torch.get_autocast_dtype(device_type)
        except (TypeError, RuntimeError):  # older torch without the device_type argument
            continue
    return None


_DTYPE_NAMES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16}
_DTYPE_NAMES |= {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


def doctor(
    model: nn.Module | ModelView | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
    *,
    autocast_dtype: torch.dtype | str | None = None,
    history: Sequence[StepRecord] | Any | None = None,
    clip_watch: ClipWatch | None = None,
    collapse_skips: int = COLLAPSE_SKIPS,
    environment: bool = False,
) -> DoctorReport:
    """Runs every registered check on this setup; see the module docstring.

    Args:
        autocast_dtype: the dtype of the training's autocast region (torch.float16, torch.bfloat16 or "fp16",
            "bf16"); None: the autocast region doctor() is called in, if any.
        history: ``Inspector.history`` (or an Inspector), or StepRecords read from a run log.
        clip_watch: a ``watch_clipping`` handle that was open during training steps.
        environment: also run the environment checks (initialises CUDA and NVML).

    Cost: walks parameters and modules once; no sync, except reading clip_watch's recorded scales (one).
    """
    if isinstance(autocast_dtype, str):
        if autocast_dtype.lower() not in _DTYPE_NAMES:
            raise ValueError(f"autocast_dtype {autocast_dtype!r}: use one of {sorted(_DTYPE_NAMES)}")
        autocast_dtype = _DTYPE_NAMES[autocast_dtype.lower()]
    if autocast_dtype is None:
        autocast_dtype = _autocast_in_effect()
    if history is not None and not isinstance(history, Sequence):
        history = history.history  # an Inspector
    setup = Setup(model, optimizer, scaler, autocast_dtype, history, clip_watch, collapse_skips)
    found = [finding for fn in findings.CHECKS for finding in fn(setup)]  # as registered when called
    if environment:
        found += check_environment()
    return DoctorReport(found)
