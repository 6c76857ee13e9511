"""amp_inspect: a numerics inspector for PyTorch mixed-precision training.

One fused pass over all gradients counts NaN/Inf/zeros, what would overflow, turn subnormal or underflow
in fp16 / bf16 / fp8, extremes, sum of squares and an exponent histogram per tensor::

    stats = amp_inspect.tensor_stats(grads, formats=("fp16", "bf16"))

and ties them to module names and GradScaler::

    insp = amp_inspect.attach(model, scaler)
    report = insp.check()   # after backward, before scaler.step
"""

from .ddp import ddp_comm_hook
from .distributed import DistributedInspectionError
from .doctor import doctor, watch_clipping
from .formats import FORMATS
from .history import StepRecord, Summary
from .inspector import Inspector, attach
from .report import Headroom, StepReport
from .runlog import read_log
from .scale_policy import HeadroomPolicy, ScaleDecision
from .scaler import InspectingGradScaler
from .stats import TensorStats, tensor_stats

__all__ = [
    "FORMATS",
    "DistributedInspectionError",
    "Headroom",
    "HeadroomPolicy",
    "InspectingGradScaler",
    "Inspector",
    "StepRecord",
    "StepReport",
    "ScaleDecision",
    "Summary",
    "TensorStats",
    "attach",
    "ddp_comm_hook",
    "doctor",
    "read_log",
    "tensor_stats",
    "watch_clipping",
]
__version__ = "0.1.0"
