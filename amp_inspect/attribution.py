"""Who is behind trouble: modules ranked by what their gradients show, and which gradients a rank's NaN/Inf
counts were taken from in a distributed run.

Torch-free: StepReport, the run-log summary and the console share it.
"""

from __future__ import annotations

from typing import Any

# Where inf_by_rank's counts were taken: each rank's own gradients before DDP's all-reduce (the rank made
# them), or each rank's FSDP2 shards after the reduce-scatter (the rank owns those elements, whoever made them).
BEFORE_ALLREDUCE = "before_allreduce"
SHARDS = "shards"
ORIGIN_HEADINGS = {
    BEFORE_ALLREDUCE: "ranks behind skipped steps (NaN/Inf in their own gradients, before the all-reduce)",
    SHARDS: "ranks whose gradient shards held the NaN/Inf of skipped steps",
}


def modules_in_trouble(modules: dict[str, dict[str, Any]]) -> list[str]:
    """Module names with NaN/Inf, overflow, underflow or subnormal gradients (first format), worst first:
    by NaN/Inf count, then overflow, underflow, subnormal."""

    def trouble(name: str) -> tuple[int, ...]:
        m = modules[name]
        return (m["nan"] + m["posinf"] + m["neginf"], m["overflow"], m["underflow"], m["subnormal"])

    return sorted((n for n in modules if any(trouble(n))), key=lambda n: tuple(-x for x in trouble(n)))
