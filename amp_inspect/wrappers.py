"""The wrappers a model may come in (torch.compile, FSDP1, FSDP2, DDP with sparse gradients): what the
inspector looks through, works around or refuses at attach, with a sentence saying why.

Each test looks only at modules already imported (``sys.modules``): a model can hold a wrapper only if its
module was imported, so nobody else pays for importing torch._dynamo or FSDP (0.4 s).
"""

from __future__ import annotations

import sys

from torch import nn

from ._torch_compat import compiled_in_place, compiled_module_type
from .naming import sparse_gradient_modules


def is_compiled(model: nn.Module) -> bool:
    """Whether ``model`` or a submodule runs through torch.compile (an OptimizedModule, or ``Module.compile()``)."""
    optimized = compiled_module_type()
    return any(isinstance(m, optimized) or compiled_in_place(m) for m in model.modules())


def has_fsdp2_modules(model: nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 (fully_shard) modules, which swap their registered parameters between
    sharded and unsharded ones around forward and backward."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    kind = getattr(fsdp, "FSDPModule", None)
    return kind is not None and any(isinstance(m, kind) for m in model.modules())


def refuse_fsdp1(model: nn.Module) -> None:
    """FSDP1 (FullyShardedDataParallel) flattens parameters into per-rank shards of a FlatParameter whose
    pieces amp_inspect does not map back to modules: refuse rather than report partial statistics."""
    fsdp1 = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp1 is not None and any(isinstance(m, fsdp1.FullyShardedDataParallel) for m in model.modules()):
        raise ValueError(
            "amp_inspect does not support FSDP1 (FullyShardedDataParallel): its flat parameters hold pieces of "
            "many parameters per rank, which it cannot name. Use FSDP2 (torch.distributed.fsdp.fully_shard), whose "
            "sharded gradients it combines across ranks into whole-parameter statistics."
        )


def refuse_sparse_with_comm_hook(model: nn.Module) -> None:
    """DDP's buckets of sparse gradients hold sparse tensors, which ddp_comm_hook cannot count NaN/Inf in: refuse
    at attach rather than fail in the first backward or drop those gradients from inf_by_rank."""
    sparse = sparse_gradient_modules(model)
    if sparse:
        raise ValueError(
            f"amp_inspect's DDP comm hook cannot trace NaN/Inf in sparse gradients ({', '.join(sparse[:5])} "
            "use sparse=True): attach with ddp_hook=False (reports then cover the averaged gradients, sparse ones "
            "included, without inf_by_rank)"
        )
