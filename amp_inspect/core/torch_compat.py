"""Every private torch name amp_inspect reaches for, in one place, each with the reason no public call does.

torch may rename or remove any of these in a release without notice; tests/test_torch_compat.py checks each
one against the installed torch and fails with a sentence naming it, so a torch upgrade breaks there, loudly,
and not as a silent wrong answer in a report. Where a public call does the job it is used instead, elsewhere:
``GradScaler.get_growth_factor()`` / ``get_backoff_factor()`` / ``get_growth_interval()`` / ``is_enabled()``,
``torch.nn.utils.clip_grads_with_norm_``, ``torch.compiler.set_stance``, the extension's own ``build_info()``
and what core/_native.py loaded (instead of asking torch's dispatcher which kernels are registered), the parameters'
device (instead of ``GradScaler._device``).

Private names that cannot be wrapped in a function, listed for the test:

- ``GradScaler._unscale_grads_(optimizer, inv_scale, found_inf, allow_fp16)`` and
  ``GradScaler._check_inf_per_device(optimizer)``: the two methods InspectingGradScaler overrides (the places
  GradScaler unscales, and checks for fused optimizers); no public hook exists there.
- ``GradScaler._maybe_opt_step(optimizer, optimizer_state, ...)``: wrapped on a plain GradScaler
  (scaling/scaler_link.py) to see a skip where GradScaler reads found_inf to the host anyway.
- ``GradScaler._per_optimizer_states[id(optimizer)]["found_inf_per_device"]``: what an override of
  ``_check_inf_per_device`` must leave there, as GradScaler's own does (``step`` reads it).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

# Path components torch's wrappers insert into parameter and module names: torch.compile's OptimizedModule,
# FSDP1's and activation checkpointing's wrappers. Private attribute names, left out of the names users see.
WRAPPER_COMPONENTS = frozenset({"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module"})

# The methods InspectingGradScaler overrides or gradscaler_patches wraps, with the parameters it relies on.
GRADSCALER_HOOKS = {
    "_unscale_grads_": ("optimizer", "inv_scale", "found_inf", "allow_fp16"),
    "_check_inf_per_device": ("optimizer",),
    "_maybe_opt_step": ("optimizer", "optimizer_state"),
}


def loss_scale_tensor(scaler: torch.amp.GradScaler) -> torch.Tensor | None:
    """GradScaler's scale as its device tensor (``_scale``), None before the first ``scale()``. ``get_scale()``
    returns a float, which syncs the host every step; reports keep the tensor and read it later."""
    return getattr(scaler, "_scale", None)


def init_scale(scaler: torch.amp.GradScaler) -> float | None:
    """The ``init_scale`` GradScaler was made with (``_init_scale``): no getter exists, and the summary's advice
    on it compares it with the scale the run settled at."""
    return getattr(scaler, "_init_scale", None)


def set_init_scale(scaler: torch.amp.GradScaler, value: float) -> None:
    """Sets the scale GradScaler starts from at its first ``scale()`` (``_init_scale``; no setter exists): the
    headroom policy starts low rather than skip its way down from init_scale."""
    scaler._init_scale = value


def reset_growth_tracker(scaler: torch.amp.GradScaler) -> None:
    """Zeroes GradScaler's count of clean steps (``_growth_tracker``, on the device: no sync), which the headroom
    policy does not use: its decisions count their own steps."""
    tracker = scaler._growth_tracker
    assert tracker is not None, "reset_growth_tracker before the first scale()"
    tracker.zero_()


def check_scale_growth_tracker(scaler: torch.amp.GradScaler, funcname: str) -> None:
    """GradScaler's own check that ``scale()`` ran before ``funcname`` (``_check_scale_growth_tracker``), with
    GradScaler's own error message."""
    scaler._check_scale_growth_tracker(funcname)


def optimizer_states(scaler: torch.amp.GradScaler) -> Mapping[int, dict[str, Any]]:
    """GradScaler's per-optimizer state (``_per_optimizer_states``: id(optimizer) -> {"stage": OptState, ...}),
    the only record of whether ``unscale_`` already ran for an optimizer this step. A defaultdict: read it with
    ``.get`` (indexing adds an entry)."""
    return getattr(scaler, "_per_optimizer_states", {})


def sparse_stored_values(grad: torch.Tensor) -> torch.Tensor:
    """A sparse COO tensor's stored values, coalesced or not (``Tensor._values()``): ``values()`` refuses an
    uncoalesced tensor, and GradScaler unscales exactly these stored values in place (a view)."""
    return grad._values()


def compiled_module_type() -> type | tuple[()]:
    """torch.compile's wrapper class (``torch._dynamo.eval_frame.OptimizedModule``; torch.compiler names no
    public type), or () where torch.compile never ran (nothing can be compiled: its module is not imported)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", ()) if eval_frame is not None else ()


def compiled_in_place(module: nn.Module) -> bool:
    """Whether ``module.compile()`` compiled this module in place (it sets ``_compiled_call_impl``; torch has
    no public query for it)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def compile_wrapped(model: nn.Module) -> nn.Module:
    """The module a torch.compile wrapper (OptimizedModule) holds (``_orig_mod``; no public accessor), or
    ``model`` itself."""
    return getattr(model, "_orig_mod", model)


def ddp_comm_hooks(ddp: nn.parallel.DistributedDataParallel) -> list[Any] | None:
    """The comm hooks DDP lists as registered (``_comm_hooks``, [(hook, state), ...]; DDP has no public query,
    and registering a second one fails only in the reducer). None where DDP does not keep the list."""
    return getattr(ddp, "_comm_hooks", None)


# ---- torch's own fused kernels, where no public call does the same in one pass ----


def foreach_norm(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each tensor in one multi-tensor launch (``torch._foreach_norm``): the benchmarks' one-read
    roofline proxy; ``torch.linalg.vector_norm`` per tensor is one launch each."""
    return list(torch._foreach_norm(tensors))


def non_finite_check_and_unscale_(
    tensors: list[torch.Tensor], found_inf: torch.Tensor, inv_scale: torch.Tensor
) -> None:
    """GradScaler's own unscale kernel (``torch._amp_foreach_non_finite_check_and_unscale_``): the fallback's
    unscale is then bit for bit GradScaler's."""
    torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf, inv_scale)


def chunk_cat(tensors: list[torch.Tensor], dim: int, num_chunks: int) -> torch.Tensor:
    """Chunks of many tensors copied into one buffer in one kernel (``torch._chunk_cat``): the reference's
    staging; torch.cat of flattened views is one copy per tensor."""
    return torch._chunk_cat(tensors, dim, num_chunks)


def fused_optimizer_devices() -> set[str]:
    """The device types torch's fused optimizers run on
    (``torch.utils._foreach_utils._get_fused_kernels_supported_devices``; no public list exists)."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    return set(_get_fused_kernels_supported_devices())


def in_backward() -> bool:
    """Whether this thread runs inside autograd's backward pass: a forward pass run there is activation
    checkpointing's recomputation (reentrant or not), which a forward hook must not count a second time. Private
    (``torch._C._current_graph_task_id``, -1 outside a backward): without it, False."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1
