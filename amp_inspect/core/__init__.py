"""The numbers: the three ops (``tensor_stats``, ``format_readiness``, ``update_stats``) and everything they stand
on. The schema of statistics (statistics.py) and the format and recipe tables (formats.py, recipes.py), each
checked against the compiled library's at load time; ops.py, the only module that calls ``torch.ops.amp_inspect``
(kernel, else the pure-torch reference); the references in references/ (oracle and fallback); the user-facing
wrappers and their result types; small torch-free helpers every floor uses (printable names, plain tables). A
change to what is counted, or how, starts here and in csrc/. Imports nothing else of the package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.core.format_readiness import ReadinessStats
    from amp_inspect.core.formats import FORMATS
    from amp_inspect.core.recipes import RECIPE_NAMES
    from amp_inspect.core.tensor_stats import TensorStats
    from amp_inspect.core.update_stats import UpdateTensorStats

_MODULE_OF = {
    "FORMATS": "formats",
    "TensorStats": "tensor_stats",
    "ReadinessStats": "format_readiness",
    "UpdateTensorStats": "update_stats",
    "RECIPE_NAMES": "recipes",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
