"""Module names as the user wrote them: each parameter maps to the qualified name of the module that owns it.

"blocks.1.mlp.fc2.weight" belongs to "blocks.1.mlp.fc2". Wrappers are looked through: DDP's and
DataParallel's "module." (only where the parent really is such a wrapper, so a user's own submodule named
"module" keeps its name), peft's "base_model.model.", a LoRA layer's "base_layer." and a modules_to_save
wrapper's "original_module." (only below peft's own classes), and torch.compile's "_orig_mod.", FSDP1's and
activation checkpointing's wrapper components anywhere, so names match the unwrapped model: a LoRA-wrapped
GPT-2 reports "transformer.h.0.attn.c_attn" for the frozen weight and "transformer.h.0.attn.c_attn.lora_A.default"
for the adapter. A tied parameter (one
tensor reachable under two names) is counted once, under the first name ``named_parameters`` gives.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from amp_inspect.core.torch_compat import WRAPPER_COMPONENTS

ROOT_NAME = "(model)"  # parameters registered directly on the model itself
_DATA_PARALLEL_TYPES = (nn.DataParallel, nn.parallel.DistributedDataParallel)
# peft (not imported here): PeftModel.base_model -> LoraModel (a BaseTuner).model -> the user's model, a
# LoRA layer's base_layer -> the original Linear / Conv1D / Embedding, and a ModulesToSaveWrapper's
# original_module -> the original module (its trained copy keeps peft's name, "head.modules_to_save.default",
# as a LoRA adapter keeps "lora_A.default"). Only below a class defined in peft.
_PEFT_WRAPPER_COMPONENTS = frozenset({"base_model", "model", "base_layer", "original_module"})


def parameter_layout(model: nn.Module) -> tuple[tuple[str, int], ...]:
    """Each parameter's raw qualified name and identity, in order: changes when a parameter is added or removed
    and when a module is wrapped or moved in place (``net.b = Wrap(net.b)``: same parameters, new names). Costs
    what ``model.parameters()`` costs (it walks ``named_parameters`` too), plus the tuple."""
    return tuple((name, id(p)) for name, p in model.named_parameters())


def _is_peft(module: nn.Module) -> bool:
    return type(module).__module__.partition(".")[0] == "peft"


def _is_wrapper_part(parent: nn.Module, component: str) -> bool:
    """Whether ``component`` under ``parent`` is a wrapper's link to the wrapped module (left out of names)."""
    if component in WRAPPER_COMPONENTS:
        return True
    if component == "module":
        return isinstance(parent, _DATA_PARALLEL_TYPES)
    return component in _PEFT_WRAPPER_COMPONENTS and _is_peft(parent)


def named_clean(model: nn.Module, named: list[tuple[str, nn.Module]]) -> list[tuple[nn.Module, str]]:
    """(module, clean name) for ``named``, ``model.named_modules()`` as already listed (no second walk), the root
    as "". A wrapper and the module it wraps share one name (both are listed)."""
    out: list[tuple[nn.Module, str]] = []
    clean_of: dict[str, str] = {"": ""}
    module_of = dict(named)
    for name, module in named:
        if name:
            parent_name, _, component = name.rpartition(".")
            parent = module_of[parent_name] if parent_name else model
            is_wrapper_part = _is_wrapper_part(parent, component)
            parent_clean = clean_of[parent_name]
            joined = f"{parent_clean}.{component}" if parent_clean else component
            clean_of[name] = parent_clean if is_wrapper_part else joined
        out.append((module, clean_of[name]))
    return out


def clean_module_names(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(module, clean name) for every module of ``model`` in ``named_modules`` order, the root as "" (one walk;
    an inspector's ModelView holds this list already)."""
    return named_clean(model, list(model.named_modules()))


def module_names(model: nn.Module) -> dict[nn.Module, str]:
    """Every submodule with its clean name. The root, and a wrapper's inner module (same name as the root),
    are left out; where a wrapper and its inner module share a name, the outer one wins."""
    names: dict[nn.Module, str] = {}
    taken: set[str] = set()
    for module, clean in clean_module_names(model):
        if clean and clean not in taken:
            taken.add(clean)
            names[module] = clean
    return names


@dataclass(frozen=True)
class ParamEntry:
    name: str  # clean parameter name, "blocks.1.mlp.fc2.weight"
    module: str  # clean owning module, "blocks.1.mlp.fc2" (ROOT_NAME for the model's own parameters)
    param: nn.Parameter


def param_entries(model: nn.Module) -> list[ParamEntry]:
    """Every distinct parameter of ``model`` with its owning module's clean name, in registration order."""
    return entries_of(clean_module_names(model))


def entries_of(modules: list[tuple[nn.Module, str]]) -> list[ParamEntry]:
    """The parameter entries of ``modules`` ((module, clean name) as ``clean_module_names`` lists them)."""
    entries = []
    seen: set[int] = set()
    for module, clean in modules:
        for local, param in module.named_parameters(recurse=False):
            if id(param) in seen:  # tied: keep the first name
                continue
            seen.add(id(param))
            entries.append(ParamEntry(f"{clean}.{local}" if clean else local, clean or ROOT_NAME, param))
    return entries
