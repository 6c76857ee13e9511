"""The model seen once: ``ModelView`` walks the module tree one time at attach and holds what every part of the
inspector asks about the model, so that no collaborator walks it again.

What it holds: the root (what attach was given) and the model behind torch.compile, DDP, FSDP and peft
(``unwrapped``); every module with its clean name (model/naming.py: wrappers looked through); the parameter
entries (tied ones once); the GEMM modules (nn.Linear and transformers' Conv1D, measured by format readiness); the
modules with sparse gradients; whether the model runs through torch.compile or holds FSDP1 / FSDP2 modules; the
device and dtype of its parameters.

When it changes: ``fingerprint`` is each parameter's raw name and identity (``named_parameters``, which walks no
module list of ours). A parameter added or removed, or a module wrapped or moved in place, changes it, and
``refresh()`` then walks the tree once more; otherwise ``refresh()`` costs one ``named_parameters`` pass. As in
fvcore's JitModelAnalysis, names are made once and every lookup goes through the view.
"""

from __future__ import annotations

import sys
from collections import Counter

import torch
from torch import nn

from amp_inspect.core.torch_compat import compile_wrapped, compiled_in_place, compiled_module_type
from amp_inspect.model.naming import ROOT_NAME, ParamEntry, entries_of, named_clean, parameter_layout


def is_gemm_module(module: nn.Module) -> bool:
    """nn.Linear (and subclasses) or transformers' Conv1D (by class: transformers need not be importable)."""
    if isinstance(module, nn.Linear):
        return True
    return any(c.__name__ == "Conv1D" and c.__module__.startswith("transformers.") for c in type(module).__mro__)


def _is_sparse(module: nn.Module) -> bool:
    return isinstance(module, (nn.Embedding, nn.EmbeddingBag)) and bool(module.sparse)


class ModelView:
    """One walk of ``root``'s modules, and what follows from it (module docstring). Attributes:

    - ``root``: the model attach was given; ``unwrapped``: the model inside torch.compile's and DDP's wrappers;
    - ``modules``: (module, clean name) for every module in ``named_modules`` order, the root as "";
    - ``names``: every submodule with its clean name, one module per name (the outer one of a wrapper pair);
    - ``entries``: every distinct parameter with its clean name and module, in registration order;
    - ``gemm_modules``: each GEMM module with its clean name (ROOT_NAME for the root), each name once;
    - ``sparse_modules``: the names of modules that make sparse gradients;
    - ``compiled``, ``fsdp1``, ``fsdp2``: whether any module is such a wrapper;
    - ``fingerprint``: the parameters' raw names and identities when the view was made.
    """

    @classmethod
    def of(cls, model: nn.Module | ModelView) -> ModelView:
        """``model`` itself when it is a view already, else a new view of it (one walk)."""
        return model if isinstance(model, ModelView) else cls(model)

    def __init__(self, root: nn.Module) -> None:
        if not isinstance(root, nn.Module):
            raise TypeError(f"the model must be an nn.Module, got {type(root).__name__}")
        self.root = root
        self.walks = 0  # how many times this view walked the tree (tests count them)
        self._build(None)

    def _build(self, fingerprint: tuple[tuple[str, int], ...] | None) -> None:
        self.walks += 1
        named = list(self.root.named_modules())
        self.modules: list[tuple[nn.Module, str]] = named_clean(self.root, named)
        # Wrapper kinds, tested only against modules already imported (a model holds one only if it was).
        fsdp1 = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
        fsdp1_kind = getattr(fsdp1, "FullyShardedDataParallel", None)
        self.fsdp1 = fsdp1_kind is not None and any(isinstance(m, fsdp1_kind) for m, _ in self.modules)
        if self.fsdp1:  # attach refuses it (model/wrappers.py) before anything reads its flat parameters
            self.entries: list[ParamEntry] = []
            self.fingerprint: tuple[tuple[str, int], ...] = ()
        else:
            self.entries = entries_of(self.modules)
            self.fingerprint = parameter_layout(self.root) if fingerprint is None else fingerprint
        self.names: dict[nn.Module, str] = {}
        taken: set[str] = set()
        for module, clean in self.modules:
            if clean and clean not in taken:
                taken.add(clean)
                self.names[module] = clean
        self.gemm_modules: dict[nn.Module, str] = {}
        gemm_taken: set[str] = set()
        for module, clean in self.modules:
            name = clean or ROOT_NAME
            if is_gemm_module(module) and module not in self.gemm_modules and name not in gemm_taken:
                self.gemm_modules[module] = name
                gemm_taken.add(name)
        self.sparse_modules = [clean or ROOT_NAME for module, clean in self.modules if _is_sparse(module)]
        optimized = compiled_module_type()
        self.compiled = any(isinstance(m, optimized) or compiled_in_place(m) for m, _ in self.modules)
        fsdp = sys.modules.get("torch.distributed.fsdp")
        fsdp2_kind = getattr(fsdp, "FSDPModule", None)
        self.fsdp2 = fsdp2_kind is not None and any(isinstance(m, fsdp2_kind) for m, _ in self.modules)

    @property
    def unwrapped(self) -> nn.Module:
        """The model inside torch.compile's and DDP's / DataParallel's wrappers at the root."""
        inner = compile_wrapped(self.root)
        while isinstance(inner, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            inner = compile_wrapped(inner.module)
        return inner

    @property
    def ddp(self) -> nn.parallel.DistributedDataParallel | None:
        """The DDP wrapper at the root, if any (torch.compile's wrapper looked through)."""
        inner = compile_wrapped(self.root)
        return inner if isinstance(inner, nn.parallel.DistributedDataParallel) else None

    @property
    def device(self) -> torch.device | None:
        """The device of the first parameter (the one hardware readings are of), None without parameters."""
        return self.entries[0].param.device if self.entries else None

    @property
    def dtype(self) -> torch.dtype | None:
        """The dtype holding most of the parameters' elements (read now: ``model.to()`` changes it), None without
        parameters."""
        held: Counter[torch.dtype] = Counter()
        for entry in self.entries:
            held[entry.param.dtype] += entry.param.numel()
        return held.most_common(1)[0][0] if held else None

    def changed(self) -> tuple[tuple[str, int], ...] | None:
        """The new fingerprint when the parameters or their names changed since the view was made, else None
        (one ``named_parameters`` pass)."""
        now = parameter_layout(self.root)
        return None if now == self.fingerprint else now

    def refresh(self) -> bool:
        """Walks the tree again when the fingerprint changed; returns whether it did. A model holding FSDP2
        modules keeps the view made at attach: FSDP2 swaps its registered parameters between sharded and
        unsharded ones around every forward and backward, which is no change of the model."""
        if self.fsdp2 or self.fsdp1:
            return False
        now = self.changed()
        if now is None:
            return False
        self._build(now)
        return True
