"""Pictures of an incident (issue 16, case 12): with the default hist_every=100, a short run's skipped steps and
the steps after them carry exponent histograms (bounded), the over-time heatmap spans the run with one column,
and the HTML's first non-finite findings that differ only in a count are one line."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

import amp_inspect
from amp_inspect.diagnosis.history import StepRecord, first_findings
from amp_inspect.inspection._hist_schedule import AFTER_SKIP, HistogramSchedule
from amp_inspect.render import plots
from tests import models

matplotlib.use("Agg")
pytestmark = pytest.mark.usefixtures("one_thread")


def logged_run(tmp_path, poison_steps: tuple[int, ...], steps: int = 30) -> list[dict]:
    model = models.gpt(0)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = amp_inspect.InspectingGradScaler("cpu", init_scale=2.0**10)
    path = tmp_path / "run.jsonl"
    insp = amp_inspect.attach(model, scaler, log=path)  # hist_every: the default, 100
    for step in range(steps):
        models.backward(model, scaler, step)
        if step in poison_steps:
            models.poison_(model, "blocks.1.mlp.fc2", math.nan)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    insp.close()
    return amp_inspect.read_log(path)


def test_skipped_steps_and_the_steps_after_them_get_histograms(tmp_path) -> None:
    records = logged_run(tmp_path, poison_steps=(12, 20))
    with_hist = [r["step"] for r in records if "hist" in r]
    assert with_hist == [0, 12, 13, 14, 20, 21, 22]  # step 0 (regular), each skip and the AFTER_SKIP after it
    assert AFTER_SKIP == 2
    fig = plots.heatmap_over_time(records, "blocks.1.mlp.fc2")
    assert len(fig.axes[0].collections) >= 1
    assert fig.axes[2].get_xlim() == (-0.5, 29.5)  # the whole run


def test_a_clean_run_keeps_only_the_regular_histograms(tmp_path) -> None:
    records = logged_run(tmp_path, poison_steps=())
    assert [r["step"] for r in records if "hist" in r] == [0]
    fig = plots.heatmap_over_time(records)
    ax_zero = fig.axes[2]
    # One column, on an axis that spans the run's 30 steps (before: -0.5 to 0.5).
    assert ax_zero.get_xlim() == (-0.5, 29.5)
    assert "the 1 of 30 logged steps with histograms" in ax_zero.get_xlabel()


def test_incident_histograms_are_bounded_and_off_with_hist_every_0() -> None:
    schedule = HistogramSchedule(100, max_incident=5)
    chosen = [s for s in range(1, 60) if schedule.wants(s, skipped=True, total_norm=math.nan)]
    assert chosen == [1, 2, 3, 4, 5] and schedule.incident_hists == 5
    off = HistogramSchedule(0)
    assert not any(off.wants(s, skipped=True, total_norm=1.0) for s in range(10))


def test_a_spike_and_the_steps_after_it_get_histograms_and_a_steady_norm_does_not() -> None:
    schedule = HistogramSchedule(100)
    norms = [1.0, 1.2, 0.9, 1.1, 1.0, 50.0, 1.0, 1.1, 1.0, 1.2]
    chosen = [s for s, n in enumerate(norms, start=1) if schedule.wants(s, skipped=False, total_norm=n)]
    assert chosen == [6, 7, 8]
    steady = HistogramSchedule(100)
    assert not any(steady.wants(s, skipped=False, total_norm=1.0 + s / 10) for s in range(1, 40))


def test_findings_that_differ_only_in_a_count_are_one_line() -> None:
    findings = [
        f"h.1.mlp.c_fc: output gradient went non-finite ({n} NaN/Inf), step {s}" for s, n in enumerate(range(10, 24))
    ]
    findings += [None, "h.0.attn: forward output overflowed fp16, amax 7.0e+04, step 3"]
    history = [StepRecord.from_log_record({"step": s, "first_nonfinite": f}) for s, f in enumerate(findings)]
    assert first_findings(history).most_common() == [
        ("h.1.mlp.c_fc: output gradient went non-finite", 14),
        ("h.0.attn: forward output overflowed fp16", 1),
    ]


def test_the_schedule_and_the_summary_call_the_same_steps_spikes() -> None:
    """One definition of a spike (amp_inspect.evidence.spikes): the steps whose histograms the schedule keeps as a
    spike's are the spikes the summary reports, NaN steps and a norm history longer than the window included."""
    from amp_inspect.evidence.spikes import find_spikes

    norms = [1.0, 1.1, 0.9, float("nan"), 1.0, 30.0, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 1.0, 1.05, 12.0, 1.0, 9.0]
    schedule = HistogramSchedule(hist_every=1000)
    scheduled = [step for step, norm in enumerate(norms, start=1) if schedule.spike(norm)]
    summary = [spike.step for spike in find_spikes(list(range(1, len(norms) + 1)), norms)]
    assert scheduled == summary == [6, 15]
