"""The figures of a run log (amp_inspect/render/plots.py): their axes follow the log."""

from __future__ import annotations

import importlib.util

import pytest

# ---- the heatmap over time starts at the log's first step ----


HAVE_MPL = importlib.util.find_spec("matplotlib") is not None


@pytest.mark.skipif(not HAVE_MPL, reason="plots need matplotlib")
@pytest.mark.parametrize("first", [0, 7])
def test_heatmap_over_time_axis_starts_at_the_first_step(first: int) -> None:
    from amp_inspect.render import plots

    records = []
    for step in range(first, first + 31):
        record = {"step": step, "scale": 1024.0, "skipped": False, "total_norm": 1.0}
        record["modules"] = {
            "m": {
                "numel": 4,
                "nan": 0,
                "posinf": 0,
                "neginf": 0,
                "zero": 0,
                "overflow": 0,
                "subnormal": 0,
                "underflow": 0,
                "amax": 1.0,
                "grad_norm": 1.0,
            }
        }
        if step % 5 == 0:
            record["hist"] = {"m": {"120": 4}}
        records.append(record)
    fig = plots.heatmap_over_time(records, module="m")
    lo, hi = fig.axes[2].get_xlim()  # the zero strip carries the step axis
    assert first - 0.5 <= lo < min(r["step"] for r in records if "hist" in r)
    assert hi <= first + 30 + 0.5
    ticks = [t for t in fig.axes[2].get_xticks() if lo <= t <= hi]
    assert ticks and min(ticks) >= first
