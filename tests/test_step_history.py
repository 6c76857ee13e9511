"""step_history.StepHistory: reports finalized in order into records, each handed to the follower and then to
the listeners; per-module norms kept on request or on a spike (with the step before's)."""

from __future__ import annotations

import torch

from amp_inspect.core.tensor_stats import tensor_stats
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.inspection._step_history import StepHistory


def _report(step: int, value: float) -> StepReport:
    return StepReport(step, tensor_stats([torch.full((4,), value), torch.ones(2)]), ["a", "b"], None)


def test_reports_are_finalized_in_order_follower_first() -> None:
    steps = StepHistory(collapse_skips=5, keep_module_norms=False)
    seen: list[tuple[str, int]] = []
    steps.listeners.append(lambda r: seen.append(("listener", r.step)))
    for step in range(3):
        steps.add(_report(step, 1.0))
    records = steps.records(lambda report, record: seen.append(("follower", record.step)))
    assert [r.step for r in records] == [0, 1, 2]
    assert seen == [(who, s) for s in range(3) for who in ("follower", "listener")]
    assert all(r.module_norms is None for r in records)  # no log, no spike: not kept
    assert steps.recent_recommended() == [r.recommended_scale for r in records if r.recommended_scale]


def test_module_norms_kept_for_the_log_and_on_a_spike_with_the_step_before() -> None:
    kept = StepHistory(collapse_skips=5, keep_module_norms=True)
    kept.add(_report(0, 1.0))
    assert kept.records(lambda *_: None)[0].module_norms == {"a": 2.0, "b": 2.0**0.5}
    steps = StepHistory(collapse_skips=5, keep_module_norms=False)
    for step in range(8):
        steps.add(_report(step, 1.0))
    steps.add(_report(8, 1000.0))  # a spike: far above the recent median
    records = steps.records(lambda *_: None)
    assert records[-1].module_norms is not None and records[-1].module_norms["a"] == 2000.0
    assert records[-2].module_norms == {"a": 2.0, "b": 2.0**0.5}  # the step before, for the comparison
    assert records[-3].module_norms is None


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
    assert history[-1].module_norms is not None  # kept because it is a spike
    assert history[0].module_norms is None  # a steady step keeps none (no log asked for them)
