"""The wrappers a model may come in (torch.compile, FSDP1, FSDP2, DDP with sparse gradients): what the
inspector looks through, works around or refuses at attach, with a sentence saying why.

The wrapper kinds are read off the model's view (model/view.py), which tests only against modules already
imported: a model can hold a wrapper only if its module was imported, so nobody else pays for importing
torch._dynamo or FSDP (0.4 s).
"""

from __future__ import annotations

from torch import nn

from amp_inspect.model.view import ModelView


def refuse_fsdp1(model: nn.Module | ModelView) -> None:
    """FSDP1 (FullyShardedDataParallel) flattens parameters into per-rank shards of a FlatParameter whose
    pieces amp_inspect does not map back to modules: refuse rather than report partial statistics."""
    if ModelView.of(model).fsdp1:
        raise ValueError(
            "amp_inspect does not support FSDP1 (FullyShardedDataParallel): its flat parameters hold pieces of "
            "many parameters per rank, which it cannot name. Use FSDP2 (torch.distributed.fsdp.fully_shard), whose "
            "sharded gradients it combines across ranks into whole-parameter statistics."
        )


def refuse_sparse_with_comm_hook(model: nn.Module | ModelView) -> None:
    """DDP's buckets of sparse gradients hold sparse tensors, which ddp_comm_hook cannot count NaN/Inf in: refuse
    at attach rather than fail in the first backward or drop those gradients from inf_by_rank."""
    sparse = ModelView.of(model).sparse_modules
    if sparse:
        raise ValueError(
            f"amp_inspect's DDP comm hook cannot trace NaN/Inf in sparse gradients ({', '.join(sparse[:5])} "
            "use sparse=True): attach with ddp_hook=False (reports then cover the averaged gradients, sparse ones "
            "included, without inf_by_rank)"
        )
