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

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.core.format_readiness import ReadinessStats, format_readiness
    from amp_inspect.core.formats import FORMATS
    from amp_inspect.core.tensor_stats import TensorStats, tensor_stats
    from amp_inspect.core.update_stats import UpdateTensorStats, update_stats
    from amp_inspect.diagnosis.doctor import doctor, watch_clipping
    from amp_inspect.diagnosis.history import StepRecord, Summary
    from amp_inspect.distributed.combine import DistributedInspectionError
    from amp_inspect.distributed.ddp import ddp_comm_hook
    from amp_inspect.gradients.step_report import Headroom, StepReport
    from amp_inspect.inspection.inspector import Inspector, attach
    from amp_inspect.runlog.log import read_log
    from amp_inspect.scaling.policies import HeadroomPolicy, ScaleDecision, ScalePolicy, register_policy
    from amp_inspect.scaling.scaler import InspectingGradScaler

from amp_inspect._version import __version__ as __version__

_MODULE_OF = {
    "FORMATS": "core.formats",
    "DistributedInspectionError": "distributed.combine",
    "Headroom": "gradients.step_report",
    "HeadroomPolicy": "scaling.policies",
    "InspectingGradScaler": "scaling.scaler",
    "Inspector": "inspection.inspector",
    "ReadinessStats": "core.format_readiness",
    "StepRecord": "diagnosis.history",
    "StepReport": "gradients.step_report",
    "ScaleDecision": "scaling.policies",
    "ScalePolicy": "scaling.policies",
    "Summary": "diagnosis.history",
    "TensorStats": "core.tensor_stats",
    "attach": "inspection.inspector",
    "ddp_comm_hook": "distributed.ddp",
    "format_readiness": "core.format_readiness",
    "doctor": "diagnosis.doctor",  # the function; its module is not named `doctor`, which would shadow it when imported
    "read_log": "runlog.log",
    "register_policy": "scaling.policies",
    "tensor_stats": "core.tensor_stats",
    "UpdateTensorStats": "core.update_stats",
    "update_stats": "core.update_stats",  # the function; a submodule named update_stats would shadow it
    "watch_clipping": "diagnosis.doctor",
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
