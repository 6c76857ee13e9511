"""The loss scale: ``InspectingGradScaler`` (GradScaler whose unscale pass is the inspection), the link that
watches a plain GradScaler (scaler_link.py), the ``ScalePolicy`` protocol and its policies (policies.py), the
scaler's decisions in words on a timeline (timeline.py, torch-free), and the watch on gradient clipping of
still-scaled gradients (clipping.py). Extension point: a policy registered with ``register_policy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.scaling.clipping import ClipWatch, watch_clipping
    from amp_inspect.scaling.policies import HeadroomPolicy, ScaleDecision, ScalePolicy, register_policy
    from amp_inspect.scaling.scaler import InspectingGradScaler

_MODULE_OF = {
    "InspectingGradScaler": "scaler",
    "ScalePolicy": "policies",
    "HeadroomPolicy": "policies",
    "ScaleDecision": "policies",
    "register_policy": "policies",
    "ClipWatch": "clipping",
    "watch_clipping": "clipping",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
