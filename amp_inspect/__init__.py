"""amp_inspect: a numerics inspector for PyTorch mixed-precision training.

One fused pass over all gradients counts NaN/Inf/zeros, what would overflow, turn subnormal or underflow
in fp16 / bf16 / fp8, extremes, sum of squares and an exponent histogram per tensor::

    stats = amp_inspect.tensor_stats(grads, formats=("fp16", "bf16"))

what each low-precision GEMM recipe (FP8, MXFP8, MXFP4, NVFP4) would lose on a tensor::

    readiness = amp_inspect.format_readiness([x, w], recipes=("mxfp8_e4m3", "nvfp4"))

and ties them to module names and GradScaler::

    insp = amp_inspect.attach(model, scaler)
    report = insp.check()   # after backward, before scaler.step

The face holds the verbs and the types users hold; everything else lives in the subpackage of its job
(``amp_inspect.scaling`` for the loss-scale policies, ``amp_inspect.diagnosis`` for findings and the history,
``amp_inspect.core`` for the statistics' types; docs/architecture.md). The names are imported on first use, so
``import amp_inspect.runlog`` (and ``amp-inspect summary``, ``amp-inspect report``) read a run log without
loading torch. Names and module paths of 0.1 still import for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from amp_inspect import _moved
from amp_inspect._lazy import lazy_names
from amp_inspect._version import __version__ as __version__

if TYPE_CHECKING:
    from amp_inspect.core.format_readiness import format_readiness
    from amp_inspect.core.tensor_stats import tensor_stats
    from amp_inspect.core.update_stats import update_stats
    from amp_inspect.diagnosis.doctor import doctor, watch_clipping
    from amp_inspect.distributed.ddp import ddp_comm_hook
    from amp_inspect.gradients.step_report import StepReport
    from amp_inspect.inspection.inspector import Inspector, attach
    from amp_inspect.runlog.log import read_log
    from amp_inspect.scaling.scaler import InspectingGradScaler

_MODULE_OF = {
    "attach": "inspection.inspector",
    "Inspector": "inspection.inspector",  # the type attach() returns
    "StepReport": "gradients.step_report",
    "InspectingGradScaler": "scaling.scaler",
    "doctor": "diagnosis.doctor",
    "watch_clipping": "diagnosis.doctor",
    "ddp_comm_hook": "distributed.ddp",
    "tensor_stats": "core.tensor_stats",
    "format_readiness": "core.format_readiness",
    "update_stats": "core.update_stats",
    "read_log": "runlog.log",
}

__all__ = sorted(_MODULE_OF)

# Names the 0.1 face held, now in the subpackage of their job: served for one release, with a warning.
_FACE_MOVED = {
    "FORMATS": "core.formats",
    "TensorStats": "core.tensor_stats",
    "ReadinessStats": "core.format_readiness",
    "UpdateTensorStats": "core.update_stats",
    "DistributedInspectionError": "distributed.combine",
    "Headroom": "evidence.headroom",
    "HeadroomPolicy": "scaling.policies",
    "ScaleDecision": "scaling.policies",
    "ScalePolicy": "scaling.policies",
    "register_policy": "scaling.policies",
    "StepRecord": "diagnosis.history",
    "Summary": "diagnosis.history",
}

_face_getattr, __dir__ = lazy_names(__name__, _MODULE_OF)
_moved.install()  # amp_inspect.checks, amp_inspect.scale_policy, ... (0.1's flat modules) for one release


# The subpackages, importable as attributes (``amp_inspect.scaling.HeadroomPolicy`` after ``import amp_inspect``).
_SUBPACKAGES = frozenset(
    {"core", "model", "runlog", "evidence", "distributed", "gradients", "probes", "scaling", "readiness", "updates"}
    | {"diagnosis", "render", "inspection", "cli", "integrations"}
)


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f"amp_inspect.{name}")
    module = _FACE_MOVED.get(name)
    if module is None:
        return _face_getattr(name)
    package = module.split(".")[0]
    warnings.warn(
        f"amp_inspect.{name} moved to amp_inspect.{module} (also amp_inspect.{package}.{name}) in 0.2; the old name "
        "goes in 0.3",
        DeprecationWarning,
        stacklevel=2,
    )
    value = getattr(importlib.import_module(f"amp_inspect.{module}"), name)
    globals()[name] = value  # warned once: later reads are plain
    return value
