"""amp_inspect: a numerics inspector for PyTorch mixed-precision training.

One fused pass over all gradients counts NaN/Inf/zeros, what would overflow, turn subnormal or underflow
in fp16 / bf16 / fp8, extremes, sum of squares and an exponent histogram per tensor::

    stats = amp_inspect.tensor_stats(grads, formats=("fp16", "bf16"))

what each low-precision GEMM recipe (FP8, MXFP8, MXFP4, NVFP4) would lose on a tensor::

    readiness = amp_inspect.format_readiness([x, w], recipes=("mxfp8_e4m3", "nvfp4"))

and ties them to module names and GradScaler::

    insp = amp_inspect.attach(model, scaler)
    report = insp.check()   # after backward, before scaler.step

The names below are imported on first use, so ``import amp_inspect.runlog`` (and ``amp-inspect summary``,
``amp-inspect report``) read a run log without loading torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names

if TYPE_CHECKING:
    from .checks import doctor, watch_clipping
    from .ddp import ddp_comm_hook
    from .distributed import DistributedInspectionError
    from .formats import FORMATS
    from .history import StepRecord, Summary
    from .inspector import Inspector, attach
    from .readiness import ReadinessStats, format_readiness
    from .report import Headroom, StepReport
    from .runlog import read_log
    from .scale_policy import HeadroomPolicy, ScaleDecision, ScalePolicy, register_policy
    from .scaler import InspectingGradScaler
    from .stats import TensorStats, tensor_stats
    from .updates import UpdateTensorStats, update_stats

__version__ = "0.1.0"

_MODULE_OF = {
    "FORMATS": "formats",
    "DistributedInspectionError": "distributed",
    "Headroom": "report",
    "HeadroomPolicy": "scale_policy",
    "InspectingGradScaler": "scaler",
    "Inspector": "inspector",
    "ReadinessStats": "readiness",
    "StepRecord": "history",
    "StepReport": "report",
    "ScaleDecision": "scale_policy",
    "ScalePolicy": "scale_policy",
    "Summary": "history",
    "TensorStats": "stats",
    "attach": "inspector",
    "ddp_comm_hook": "ddp",
    "format_readiness": "readiness",
    "doctor": "checks",  # the function; its module is not named `doctor`, which would shadow it when imported
    "read_log": "runlog",
    "register_policy": "scale_policy",
    "tensor_stats": "stats",
    "UpdateTensorStats": "updates",
    "update_stats": "updates",  # the function; a submodule named update_stats would shadow it
    "watch_clipping": "checks",
}

__all__ = [
    "FORMATS",
    "DistributedInspectionError",
    "Headroom",
    "HeadroomPolicy",
    "InspectingGradScaler",
    "Inspector",
    "ReadinessStats",
    "StepRecord",
    "StepReport",
    "ScaleDecision",
    "ScalePolicy",
    "Summary",
    "TensorStats",
    "UpdateTensorStats",
    "attach",
    "ddp_comm_hook",
    "doctor",
    "format_readiness",
    "read_log",
    "register_policy",
    "tensor_stats",
    "update_stats",
    "watch_clipping",
]


__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
