"""What a step's numbers show, decided from typed data and torch-free: where NaN/Inf started (attribution.py,
the one ranking every surface shows), gradient spikes (spikes.py), and how far the loss scale sits from a format's
edges (headroom.py). The step report carries these; the diagnosis and the renderers read them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.evidence.attribution import blame
    from amp_inspect.evidence.headroom import Headroom

_MODULE_OF = {
    "Headroom": "headroom",
    "blame": "attribution",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
