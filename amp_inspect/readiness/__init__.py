"""Format readiness of the GEMM operands (``readiness_every=N``): the hooks on each Linear / Conv1D that
measure X, W, dY and dW with ``format_readiness`` (hooks.py), the per-module ``ReadinessReport`` with its verdicts
(report.py, torch-free) and the module x recipe heatmap (plot.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.readiness.report import ReadinessReport

_MODULE_OF = {
    "ReadinessReport": "report",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF, was_module="amp_inspect.core.format_readiness")
