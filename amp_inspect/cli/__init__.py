"""The commands: ``amp-inspect`` (commands.py: summary, report, doctor, updates, readiness, info, demo; its entry
point is this package's ``main``), the demo and its tiny GPT, the pure-Python checks it and the benchmarks compare
against (baselines.py), and ``info``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.cli.commands import build_parser, main

# ``amp-inspect = "amp_inspect.cli:main"`` (pyproject.toml): the function, from commands.py on first use.
_MODULE_OF = {"main": "commands", "build_parser": "commands"}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
