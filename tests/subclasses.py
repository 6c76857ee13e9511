"""Tensor-subclass weights as quantized training makes them (torchao.prototype.quantized_training), for the tests
of what the inspector reads of them (amp_inspect/model/subclasses.py):

- ``Int8Weight``: torchao's int8 weight-only quantized-training pattern: a wrapper subclass holding int8 values and
  a per-row scale, whose F.linear dequantizes inside a custom autograd function (its gradient is a plain tensor);
  its ``__torch_dispatch__`` knows detach and the optimizer's in-place add and refuses everything else, as
  torchao's does. No plain tensor holds its values: they are not measured.
- ``MasterWeight``: one inner tensor of its own shape and dtype holding the values, every op run on it and the
  results wrapped again (torchao's float8 / bitnet training weights keep their high-precision weight so). Its
  gradients are MasterWeights too; the inner tensor is read, exactly.

``int8_model`` / ``master_model``: a two-Linear model with the first layer's weight so.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._pytree import tree_map


class _Int8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: Int8Weight, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return F.linear(x, weight.dequantize(), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        rows = grad.reshape(-1, grad.shape[-1])
        grad_weight = rows.t() @ x.reshape(-1, x.shape[-1])
        return grad @ weight.dequantize(), grad_weight, rows.sum(0) if ctx.has_bias else None


class Int8Weight(torch.Tensor):
    @staticmethod
    def __new__(cls, int_data: torch.Tensor, scale: torch.Tensor) -> Int8Weight:
        return torch.Tensor._make_wrapper_subclass(cls, int_data.shape, dtype=scale.dtype, device=int_data.device)

    def __init__(self, int_data: torch.Tensor, scale: torch.Tensor) -> None:
        self.int_data, self.scale = int_data, scale

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Int8Weight:
        scale = weight.detach().abs().amax(1).clamp_min(1e-12) / 127
        return cls(torch.round(weight.detach() / scale[:, None]).to(torch.int8), scale)

    def dequantize(self) -> torch.Tensor:
        return self.int_data.float() * self.scale[:, None]

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["int_data", "scale"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, ctx: None, size: Any, stride: Any) -> Int8Weight:
        return Int8Weight(inner["int_data"], inner["scale"])

    def __repr__(self) -> str:
        return f"Int8Weight(shape={tuple(self.shape)})"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is F.linear:
            return _Int8Linear.apply(*args, *(kwargs or {}).values())
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func is torch.ops.aten.detach.default:
            return Int8Weight(args[0].int_data, args[0].scale)
        if func is torch.ops.aten.add_.Tensor:  # an optimizer's step: requantized, in place
            weight, update = args[0], args[1] * (kwargs or {}).get("alpha", 1)
            fresh = Int8Weight.from_float(weight.dequantize() + update)
            weight.int_data.copy_(fresh.int_data)
            weight.scale.copy_(fresh.scale)
            return weight
        raise NotImplementedError(f"Int8Weight dispatch: attempting to run unimplemented operator/function: {func}")


class MasterWeight(torch.Tensor):
    @staticmethod
    def __new__(cls, data: torch.Tensor) -> MasterWeight:
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, dtype=data.dtype, device=data.device, requires_grad=data.requires_grad
        )

    def __init__(self, data: torch.Tensor) -> None:
        self._data = data

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["_data"], None

    @staticmethod
    def __tensor_unflatten__(inner: dict, ctx: None, size: Any, stride: Any) -> MasterWeight:
        return MasterWeight(inner["_data"])

    def __repr__(self) -> str:
        return f"MasterWeight({self._data!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        def unwrap(t: object) -> object:
            return t._data if isinstance(t, MasterWeight) else t

        def wrap(t: object) -> object:
            return MasterWeight(t) if isinstance(t, torch.Tensor) and not isinstance(t, MasterWeight) else t

        return tree_map(wrap, func(*tree_map(unwrap, args), **tree_map(unwrap, kwargs or {})))


def _two_linear(seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def int8_model(seed: int = 0) -> nn.Sequential:
    model = _two_linear(seed)
    model[0].weight = nn.Parameter(Int8Weight.from_float(model[0].weight))
    return model


def master_model(seed: int = 0) -> nn.Sequential:
    model = _two_linear(seed)
    model[0].weight = nn.Parameter(MasterWeight(model[0].weight.detach().clone()))
    return model
