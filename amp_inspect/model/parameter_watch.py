"""The parameters an inspector inspects, under their current names, and the changes it notices at check().

A parameter added to or removed from the model after attach is noticed (with a warning naming it) and
inspected from then on; a module wrapped or moved in place (the same parameters under new names) is renamed
silently. FSDP2 swaps its registered parameters itself around every forward and backward: there the set is
taken as it was at attach. Cost per check(): one pass over ``model.named_parameters()``, no device work; the module tree
is walked again (model/view.py) only when that pass shows a change.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from amp_inspect.core.printable import shown_name
from amp_inspect.model.naming import ParamEntry
from amp_inspect.model.view import ModelView

SHOWN_NAMES = 10  # names a warning lists before "..."


class ParameterWatch:
    """``entries``: every distinct parameter with its clean name and module, in registration order."""

    def __init__(self, model: nn.Module | ModelView) -> None:
        self.view = ModelView.of(model)
        self.entries: list[ParamEntry] = self.view.entries
        self._module_of = {id(e.param): e.module for e in self.entries}
        self._watching = not self.view.fsdp2

    @property
    def device(self) -> torch.device | None:
        """The device of the first parameter (the one the hardware readings are of), None without parameters."""
        return self.entries[0].param.device if self.entries else None

    def module_of(self, param: torch.Tensor) -> str | None:
        """The module name of ``param``, None for a parameter not in ``entries``."""
        return self._module_of.get(id(param))

    def refresh(self, stacklevel: int = 2) -> bool:
        """Takes the model's current parameters and names; warns (at ``stacklevel`` above the caller) when
        some were added or removed. Returns whether anything changed, names included."""
        if not self._watching:
            return False
        self.view.refresh()  # one named_parameters pass; the module tree is walked only on a change
        if self.view.entries is self.entries:  # (the view may have been refreshed by a readiness step first)
            return False
        old = {id(e.param): e.name for e in self.entries}
        self.entries = self.view.entries
        self._module_of = {id(e.param): e.module for e in self.entries}
        added = [e.name for e in self.entries if id(e.param) not in old]
        kept = {id(e.param) for e in self.entries}
        removed = [name for key, name in old.items() if key not in kept]
        if added or removed:
            parts = [
                f"{label} {', '.join(map(shown_name, names[:SHOWN_NAMES]))}{' ...' if len(names) > SHOWN_NAMES else ''}"
                for label, names in (("added", added), ("removed", removed))
                if names
            ]
            warnings.warn(
                f"amp_inspect: the model's parameters changed since attach ({'; '.join(parts)}): inspecting the "
                "current ones from now on",
                RuntimeWarning,
                stacklevel=stacklevel + 1,
            )
        return True
