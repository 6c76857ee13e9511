"""Which plain tensor holds a tensor subclass's values, where one holds them exactly, for the passes that read a
model's parameters and gradients (the gradient pass, readiness, update_every, the weight check after NaN/Inf).

The compiled ops read plain dense tensors. A tensor subclass with its own ``__torch_dispatch__`` (torchao's
quantized-training weights, any wrapper made with ``_make_wrapper_subclass``) either refuses the op or re-wraps its
outputs, so the statistics of a subclass are read here from a plain tensor or not at all:

- a plain tensor or ``nn.Parameter``: itself (nothing changes for them);
- a DTensor: itself; distributed/combine.py reads it by its local shard (and a shard that is a subclass here);
- a subclass without its own ``__torch_dispatch__`` (a Python subclass that only marks the tensor or overrides
  ``__torch_function__``): the same storage seen as a plain tensor (``as_subclass``: no copy);
- a wrapper subclass whose ``__tensor_flatten__`` names one inner tensor of its own shape, dtype and device (torchao's
  float8 training weight and its bitnet / int8 mixed-precision training weights keep the high-precision weight so,
  quantizing only inside the GEMM): that inner tensor, the values the subclass stands for;
- anything else (an int8 tensor and its scales, NF4's blocks, several inner tensors): None. The values exist only
  after a dequantization that is the subclass's own, so they are not measured; the callers say so once.

Nothing is copied or changed: the tensor returned shares the caller's storage.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

__all__ = ["plain_values", "subclass_name"]

_PLAIN_TYPES = (torch.Tensor, nn.Parameter)


def _is_dtensor(tensor: torch.Tensor) -> bool:
    # Tested only against DTensor when its module was imported: a tensor is a DTensor only if it was.
    module = sys.modules.get("torch.distributed.tensor")
    kind = getattr(module, "DTensor", None)
    return kind is not None and isinstance(tensor, kind)


def plain_values(tensor: torch.Tensor) -> torch.Tensor | None:
    """The plain tensor holding ``tensor``'s values exactly (itself for a plain tensor, a Parameter or a DTensor),
    or None where no plain tensor holds them (module docstring)."""
    kind = type(tensor)
    if kind in _PLAIN_TYPES or _is_dtensor(tensor):
        return tensor
    if isinstance(tensor, nn.parameter.UninitializedTensorMixin):  # a lazy module's parameter: no values yet
        return None
    if kind.__torch_dispatch__ is torch.Tensor.__torch_dispatch__:
        return tensor.as_subclass(torch.Tensor)
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return None
    try:
        names, _ = flatten()
    except Exception:  # a subclass's own code: whatever it raises, its values are not read
        return None
    if len(names) != 1:
        return None
    inner = getattr(tensor, names[0], None)
    if not isinstance(inner, torch.Tensor) or inner is tensor:
        return None
    values = plain_values(inner)
    same = values is not None and (values.shape, values.dtype, values.device) == (
        tensor.shape,
        tensor.dtype,
        tensor.device,
    )
    return values if same and not _is_dtensor(values) else None


def subclass_name(tensor: torch.Tensor) -> str:
    """The subclass's class name, as the warnings name it."""
    return type(tensor).__name__
