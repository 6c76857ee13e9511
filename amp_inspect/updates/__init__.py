"""What each optimizer step did (``optimizer=``, ``update_every=N``): the step hooks that snapshot the
parameters and run ``update_stats`` (watch.py), the per-module ``UpdateStats`` with its verdicts (report.py,
torch-free) and the update-ratio figure (plot.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.updates.report import UpdateStats

_MODULE_OF = {
    "UpdateStats": "report",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF, was_module="amp_inspect.core.update_stats")
