"""The autocast dtype a model's forward actually runs under, seen from inside the forward.

``check()`` runs after backward, outside any autocast region, so the Inspector cannot ask torch there. A forward
pre-hook on the model and on its direct children (a LightningModule or a wrapper often calls a child, not
itself) reads ``torch.is_autocast_enabled`` / ``torch.get_autocast_dtype`` for the parameters' device type each
time one runs: the run's advice then fits the run (fp16 margins only in fp16 runs, ``formats`` following a bf16
run).

The hooks stay only until a forward has been seen (the Inspector removes them at the next ``check()``): a run's
autocast dtype does not change from step to step, and hooks left on a model that a torch.compile wrapper calls
would make it recompile.

Cost: one Python call per hooked module call in the first step, no device work, no sync.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from amp_inspect.core.formats import FORMAT_BOUNDS

AUTOCAST_OFF = "off"  # a forward seen outside any autocast region


def autocast_format(device_type: str) -> str | None:
    """The format name of the autocast region in effect for ``device_type`` ("fp16", "bf16"), AUTOCAST_OFF outside
    one, None when torch cannot say (another dtype, an older torch)."""
    try:
        if not torch.is_autocast_enabled(device_type):
            return AUTOCAST_OFF
        dtype = torch.get_autocast_dtype(device_type)
    except (TypeError, RuntimeError, AttributeError):
        return None
    return next((name for name, b in FORMAT_BOUNDS.items() if b.dtype == dtype), None)


class AutocastWatch:
    """Remembers the autocast format of the first forwards of ``model`` (or of a direct child)."""

    def __init__(self, model: nn.Module, device_type: str) -> None:
        self.device_type = device_type
        self.seen: str | None = None  # "fp16", "bf16", AUTOCAST_OFF: what the forward ran under; None before any
        self._handles: list[RemovableHandle] = [
            m.register_forward_pre_hook(self._look) for m in (model, *model.children())
        ]

    def _look(self, *_: object) -> None:
        found = autocast_format(self.device_type)
        if found is not None and self.seen in (None, AUTOCAST_OFF):  # a child inside the region says more
            self.seen = found

    def settle(self) -> None:
        """Removes the hooks once a forward has been seen (its answer is kept)."""
        if self.seen is not None:
            self.remove()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
