"""Statistics across ranks: combining a step's statistics over the process group or shard group
(combine.py: the schema's merge as all-reduces, the layout check, timeouts) and the DDP comm hook that counts each
rank's NaN/Inf before the all-reduce (ddp.py), handed to the step's report as a ``RankOrigin``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.distributed.combine import DistributedInspectionError
    from amp_inspect.distributed.ddp import ddp_comm_hook

_MODULE_OF = {
    "DistributedInspectionError": "combine",
    "ddp_comm_hook": "ddp",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF, was_module="combine")
