"""The weight watch: after a step whose gradients held NaN/Inf, one fused pass over the parameters says whether the
weights themselves are NaN/Inf (evidence/weights.py's WeightsSeen, on the report as ``report.weights``). Healthy
steps never pay for it: the pass runs only once the watch has seen a report with NaN/Inf gradients, and again on
each later step that has them.

Which weights a read sees, so that the incident timeline (diagnosis/incident.py) can tell a new NaN from one the
weights carry: at the end of check() (no InspectingGradScaler, or its unscale not run yet) the step's optimizer step
has not run, so the read shows the weights the checked step's forward pass used (``into_step`` = that step); at
an InspectingGradScaler's update() the optimizer step has run (or was skipped), so the read shows the weights of
the next step. The trigger is a report whose statistics are on the host: on the CPU at once; on CUDA, where
reports are read one step behind without a sync, the read comes one step later.

The pass reads this rank's pieces of sharded parameters (FSDP2: its shards; the read says so in ``partial``); it
changes nothing and keeps nothing but the per-tensor counts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from amp_inspect.core.tensor_stats import SUPPORTED_DTYPES, tensor_stats
from amp_inspect.distributed.combine import local_shards
from amp_inspect.evidence.weights import WeightsSeen
from amp_inspect.gradients.step_report import HostCopy, StepReport
from amp_inspect.model.naming import ParamEntry
from amp_inspect.model.subclasses import plain_values
from amp_inspect.probes.probe import NOTHING, ReportParts

__all__ = ["WeightCheck", "WeightWatch"]


class WeightCheck:
    """One read of the weights on its way to the host (a report part: ``ready()``, ``to_record()``); ``seen`` is
    the WeightsSeen it amounts to (waits for the copy on CUDA, the first use only)."""

    def __init__(self, into_step: int, counts: torch.Tensor, modules: Sequence[str], partial: str = "") -> None:
        self.into_step = into_step
        self._copy = HostCopy({"counts": counts}, counts.device)
        self._modules = list(modules)
        self._partial = partial
        self._seen: WeightsSeen | None = None

    def ready(self) -> bool:
        return self._copy.ready()

    @property
    def seen(self) -> WeightsSeen:
        if self._seen is None:
            counts = self._copy.host()["counts"]
            by_module: dict[str, int] = {}
            for module, n in zip(self._modules, counts.tolist(), strict=True):
                if n:
                    by_module[module] = by_module.get(module, 0) + int(n)
            ordered = dict(sorted(by_module.items(), key=lambda item: -item[1]))  # stable: model order in ties
            self._seen = WeightsSeen(self.into_step, ordered, self._partial)
        return self._seen

    def to_record(self) -> dict:
        return self.seen.to_record()


def _readable(param: torch.Tensor) -> torch.Tensor | None:
    """The values of a parameter the pass reads: complex as real pairs; a tensor subclass's plain values
    (model/subclasses.py); None for one it cannot read (meta, sparse, integer or other dtypes, which hold no NaN; a
    quantized subclass, whose values no plain tensor holds)."""
    values = plain_values(param)
    if values is None:
        return None
    t = values.detach()
    if t.layout != torch.strided or t.device.type == "meta":
        return None
    if t.is_complex():
        t = torch.view_as_real(t)
    return t if t.dtype in SUPPORTED_DTYPES else None


def read_weights(entries: Sequence[ParamEntry], into_step: int) -> WeightCheck | None:
    """One pass over the parameters of ``entries`` (no host sync for parameters on one device); None without any
    parameter to read."""
    rows: list[torch.Tensor] = []
    modules: list[str] = []
    for entry in entries:
        values = _readable(entry.param)
        if values is not None:
            rows.append(values)
            modules.append(entry.module)
    if not rows:
        return None
    shards, _, partial = local_shards(rows)
    # An FSDP2 shard can itself be a subclass (torchao's float8 weights under fully_shard): read by its plain values.
    pairs = [
        (values, module)
        for shard, module in zip(shards, modules, strict=True)
        if (values := plain_values(shard)) is not None
    ]
    if not pairs:
        return None
    rows, modules = [values for values, _ in pairs], [module for _, module in pairs]
    with torch.no_grad():
        stats = tensor_stats(rows, formats=("bf16",))
    counts = stats.nan + stats.posinf + stats.neginf
    return WeightCheck(into_step, counts, modules, partial or "")


class WeightWatch:
    """The probe (probes/probe.py) that reads the weights after NaN/Inf gradients; ``entries`` gives the
    inspector's parameters at the time of the read (they may change between steps)."""

    def __init__(self, entries: Callable[[], Sequence[ParamEntry]]) -> None:
        self._entries = entries
        self._waiting: list[StepReport] = []  # reports whose gradients' verdict is not on the host yet

    def annotate(self, report: StepReport) -> ReportParts:
        return NOTHING

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool) -> ReportParts:
        if report is None:
            return NOTHING
        if report.weights is None and all(r is not report for r in self._waiting):
            self._waiting.append(report)
        due = False
        waiting = []
        for seen in self._waiting:
            if seen.gradients_ready():
                due = due or seen.found_inf  # on the host: no wait
            else:
                waiting.append(seen)
        self._waiting = waiting
        if not due or report.weights is not None:
            return NOTHING
        # Before the optimizer step of the checked step (check()), the weights are those its forward used; after
        # it (an InspectingGradScaler's update()), those of the next step.
        into_step = next_step if optimizer_done else next_step - 1
        check = read_weights(self._entries(), into_step)
        return NOTHING if check is None else {"weights": check}

    def close(self) -> None:
        self._waiting.clear()
