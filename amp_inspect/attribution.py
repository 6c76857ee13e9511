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


def count(module: dict[str, Any], key: str) -> int:
    """A module record's count ``key``, 0 when the record lacks it (a hand-made or foreign log: the log reader
    checks the types of the fields present, not that every field is there)."""
    value = module.get(key, 0)
    return value if isinstance(value, int) else 0


def modules_in_trouble(modules: dict[str, dict[str, Any]]) -> list[str]:
    """Module names with NaN/Inf, overflow, underflow or subnormal gradients (first format), worst first:
    by NaN/Inf count, then overflow, underflow, subnormal."""

    def trouble(name: str) -> tuple[int, ...]:
        m = modules[name]
        bad = count(m, "nan") + count(m, "posinf") + count(m, "neginf")
        return (bad, count(m, "overflow"), count(m, "underflow"), count(m, "subnormal"))

    return sorted((n for n in modules if any(trouble(n))), key=lambda n: tuple(-x for x in trouble(n)))
