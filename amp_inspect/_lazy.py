"""Names a package imports on first use: ``amp_inspect`` itself (so reading a run log loads no torch) and
``amp_inspect.integrations`` (so it loads no optional package). Torch-free."""

from __future__ import annotations

import importlib
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def lazy_names(
    package: str, module_of: Mapping[str, str], *, was_module: str | None = None
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``, whose name ``n`` lives in its submodule
    ``module_of[n]``. A name is imported at its first use and then set on the package, so later uses are plain
    attribute reads. ``was_module``: the package took the name of a 0.1 module that now lives there (a submodule
    path): its other public names are served for one release, with a DeprecationWarning."""

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None and was_module is not None and not name.startswith("_"):
            old = importlib.import_module(was_module if "." in was_module else f"{package}.{was_module}")
            if hasattr(old, name):
                warnings.warn(
                    f"{package}.{name} is {old.__name__}.{name} since amp_inspect 0.2 ({package} was a module in "
                    "0.1); the old path goes in 0.3",
                    DeprecationWarning,
                    stacklevel=2,
                )
                value = getattr(old, name)
                setattr(sys.modules[package], name, value)  # warned once: later reads are plain
                return value
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *module_of})

    return __getattr__, __dir__
