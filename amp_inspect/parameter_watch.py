"""The parameters an inspector inspects, under their current names, and the changes it notices at check().

A parameter added to or removed from the model after attach is noticed (with a warning naming it) and
inspected from then on; a module wrapped or moved in place (the same parameters under new names) is renamed
silently. FSDP2 swaps its registered parameters itself around every forward and backward: there the set is
taken as it was at attach. Cost per check(): one pass over ``model.named_parameters()``, no device work.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from .naming import ParamEntry, param_entries, parameter_layout
from .printable import shown_name
from .wrappers import has_fsdp2_modules

SHOWN_NAMES = 10  # names a warning lists before "..."


class ParameterWatch:
    """``entries``: every distinct parameter with its clean name and module, in registration order."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.entries: list[ParamEntry] = param_entries(model)
        self._module_of = {id(e.param): e.module for e in self.entries}
        self._watching = not has_fsdp2_modules(model)
        self._layout = parameter_layout(model) if self._watching else ()

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
        layout = parameter_layout(self.model)
        if layout == self._layout:
            return False
        old = {id(e.param): e.name for e in self.entries}
        self.entries = param_entries(self.model)
        self._module_of = {id(e.param): e.module for e in self.entries}
        self._layout = layout
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
