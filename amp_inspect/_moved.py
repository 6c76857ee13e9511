"""Old import paths for one release: before 0.2 every module sat flat in ``amp_inspect/`` (``amp_inspect.checks``,
``amp_inspect.scale_policy``, ``amp_inspect.table`` ...). Importing one of those names still works, with one
DeprecationWarning naming the new path, and gives the module at its new place (the same module object, so
``isinstance`` and monkeypatching see one class). Four old names are packages now (``runlog``, ``readiness``,
``updates``, ``distributed``): their ``__init__`` serves the old module's names (runlog/__init__.py and the
others). Torch-free; nothing is imported until an old name is.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# old module (under amp_inspect.) -> its new place; removed in 0.3.
MOVED = {
    "_native": "core._native",
    "_ops": "core.ops",
    "_torch_compat": "core.torch_compat",
    "activation_arming": "probes._activation_arming",
    "activations": "probes.activations",
    "argtypes": "cli.argtypes",
    "attach_refusals": "inspection._refusals",
    "attribution": "evidence.attribution",
    "autocast_watch": "model.autocast_watch",
    "backward_order": "model.backward_order",
    "baselines": "cli.baselines",
    "checked": "scaling._checked",
    "checks": "diagnosis.doctor",
    "clipping": "scaling.clipping",
    "console": "render.console",
    "ddp": "distributed.ddp",
    "demo": "cli.demo",
    "eager_stance": "probes.eager_stance",
    "environment_checks": "diagnosis.environment_checks",
    "findings": "diagnosis.findings",
    "formats": "core.formats",
    "gradient_pass": "gradients.gradient_pass",
    "gradscaler_patches": "scaling.scaler_link",
    "hardware": "runlog.hardware",
    "headroom": "evidence.headroom",
    "hist_schedule": "inspection._hist_schedule",
    "history": "diagnosis.history",
    "html_report": "render.html_report",
    "inspector": "inspection.inspector",
    "naming": "model.naming",
    "optimizer_watch": "updates.watch",
    "options": "inspection.options",
    "parameter_watch": "model.parameter_watch",
    "plots": "render.plots",
    "printable": "core.printable",
    "readiness_hooks": "readiness.hooks",
    "readiness_plot": "readiness.plot",
    "readiness_report": "readiness.report",
    "recipes": "core.recipes",
    "reference": "core.references.tensor_stats",
    "reference_readiness": "core.references.format_readiness",
    "reference_update": "core.references.update_stats",
    "report": "gradients.step_report",
    "run_advice": "inspection.run_advice",
    "run_log_sink": "inspection._log_sink",
    "scale_policy": "scaling.policies",
    "scale_timeline": "scaling.timeline",
    "scaler": "scaling.scaler",
    "series": "render.series",
    "setup_checks": "diagnosis.setup_checks",
    "spikes": "evidence.spikes",
    "statistics": "core.statistics",
    "stats": "core.tensor_stats",
    "step_context": "gradients.step_context",
    "step_history": "inspection._step_history",
    "table": "core.table",
    "thread_guard": "inspection._thread_guard",
    "tiny_gpt": "cli.tiny_gpt",
    "update_plot": "updates.plot",
    "update_report": "updates.report",
    "wrappers": "model.wrappers",
}


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new} in amp_inspect 0.2; the old path goes in 0.3",
            DeprecationWarning,
            stacklevel=4,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new place already."""


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds ``amp_inspect.<old>`` for the names of ``MOVED`` and nothing else."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != "amp_inspect" or name not in MOVED:
            return None
        new = f"amp_inspect.{MOVED[name]}"
        return importlib.machinery.ModuleSpec(fullname, _MovedLoader(new))


def install() -> None:
    """Adds the finder once (``import amp_inspect`` calls this)."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(MovedFinder())
