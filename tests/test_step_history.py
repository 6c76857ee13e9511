"""step_history.StepHistory: reports finalized in order into records, each handed to the follower and then to
the listeners; every record keeps its per-module norms, equal to the report's per-module tables."""

from __future__ import annotations

import torch

from amp_inspect.core.tensor_stats import tensor_stats
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.inspection._step_history import StepHistory


def _report(step: int, value: float) -> StepReport:
    return StepReport(step, tensor_stats([torch.full((4,), value), torch.ones(2)]), ["a", "b"], None)


def test_reports_are_finalized_in_order_follower_first() -> None:
    steps = StepHistory(collapse_skips=5)
    seen: list[tuple[str, int]] = []
    steps.listeners.append(lambda r: seen.append(("listener", r.step)))
    for step in range(3):
        steps.add(_report(step, 1.0))
    records = steps.records(lambda report, record: seen.append(("follower", record.step)))
    assert [r.step for r in records] == [0, 1, 2]
    assert seen == [(who, s) for s in range(3) for who in ("follower", "listener")]
    assert all(r.module_norms == {"a": 2.0, "b": 2.0**0.5} for r in records)  # kept, log or not
    assert steps.recent_recommended() == [r.recommended_scale for r in records if r.recommended_scale]


def test_module_norms_are_the_per_module_tables_norms_every_step() -> None:
    """The cheap sums every record keeps equal the per-module tables' grad_norm, bit for bit (NaN where a value is
    NaN/Inf), scaled or not: a spike is judged the same whether or not a log made those tables."""
    import math

    for scale in (None, torch.tensor(1024.0)):
        stats = tensor_stats([torch.full((4,), 3.0), torch.tensor([1.0, math.nan]), torch.randn(7)])
        report = StepReport(0, stats, ["a", "b", "a"], scale)
        tables = {m: r["grad_norm"] for m, r in report.by_module.items()}
        cheap = report.module_norms()
        assert cheap.keys() == tables.keys() and math.isnan(cheap["b"]) and math.isnan(tables["b"])
        assert cheap["a"] == tables["a"]


def test_a_spike_after_nan_steps_gets_module_norms_as_the_summary_sees_it() -> None:
    """The inspector keeps per-module norms on a spike step, judged on the last finite norms as the summary's
    find_spikes judges them: eight NaN steps between the steady steps and the spike do not hide it."""
    import math

    import torch

    import amp_inspect
    from amp_inspect.evidence.spikes import find_spikes

    model = torch.nn.Linear(4, 4)
    insp = amp_inspect.attach(model, activations="off")
    for value in [1.0, 1.0, 1.0] + [math.nan] * 8 + [30.0]:
        for p in model.parameters():
            p.grad = torch.full_like(p, value)
        insp.check()
    history = insp.history
    spikes = find_spikes([r.step for r in history], [r.total_norm for r in history])
    assert [s.step for s in spikes] == [history[-1].step]
    assert history[-1].module_norms is not None and history[0].module_norms is not None  # every step, no log
