"""One step's gradients: the pass over them that ``check()`` and both scaler hooks run (gradient_pass.py), the
``StepReport`` it makes (step_report.py: per-module views, headroom, host values read lazily), and what the report
learns beside its gradients (step_context.py: autocast dtype, backward order, formats that follow them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.gradients.step_report import StepReport

_MODULE_OF = {
    "StepReport": "step_report",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
