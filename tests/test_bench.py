"""The benchmarks' own arithmetic (bench/harness.py, bench/bench_scaler.py): what a wrong figure there would
silently misreport. No timing is asserted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import bench_scaler  # noqa: E402
import harness  # noqa: E402


def test_interleave_rotates_the_starting_runner_and_keeps_records_per_runner() -> None:
    order: list[str] = []

    def step(name: str) -> str:
        order.append(name)
        return name

    warm, timed = harness.interleave(["a", "b", "c"], step, warmup=1, rounds=3, steps_per_round=2)
    assert "".join(order) == "abc" + "aabbcc" + "bbccaa" + "ccaabb"  # warm-up, then rounds starting at a, b, c
    assert warm == [["a"], ["b"], ["c"]]
    assert timed[1] == [["b", "b"]] * 3


def test_median_ci_is_order_statistics_around_the_median() -> None:
    assert harness.median_ci(list(range(1, 101))) == (41, 60)  # k = floor((100 - 1.96 * 10) / 2) = 40
    assert harness.median_ci([3.0, 1.0]) == (1.0, 3.0)  # few values: the extremes


def test_target_lines_show_the_measured_value_and_the_bound() -> None:
    ok = harness.at_most("ratio", 1.02, 1.05)
    assert ok.passed and ok.detail == "1.020x (at most 1.05x)"
    miss = harness.at_least("speedup", 40.0, 50.0, "detail")
    assert not miss.passed and miss.detail == "40.000x (at least 50x); detail"
    pct = harness.at_most("overhead", 3.5, 3.0, unit="%")
    assert not pct.passed and pct.detail == "+3.50% (at most 3%)"


def _summary(scenario: str, scales: list[float], skipped: list[bool]) -> dict:
    steps = len(scales)
    underflow = [None if s else 0.0 for s in skipped]
    return bench_scaler.summarize(scenario, scales, skipped, [1.0] * steps, underflow)


def test_skip_kinds_warmup_growth_other_and_planted() -> None:
    steps = 130
    scales = [2.0**16] * steps
    skipped = [False] * steps
    skipped[0] = skipped[1] = True  # before the first applied step: warm-up
    scales[1], scales[2:] = 2.0**15, [2.0**14] * (steps - 2)
    scales[50] = 2.0**15  # raised for step 50, which overflows: growth
    skipped[50] = True
    skipped[60] = True  # same scale as the step before: other
    skipped[120] = skipped[121] = skipped[122] = True  # planted NaN steps
    s = _summary("nan", scales, skipped)
    assert s["skipped"] == {"warmup": 2, "growth": 1, "spike": 0, "nan": 3, "other": 1}
    assert s["skipped_total"] == 7
    assert s["skipped_at"][:3] == [[0, "warmup"], [1, "warmup"], [50, "growth"]]
    # The same skips in a clean run: the planted steps are no longer planted.
    s = _summary("clean", scales, skipped)
    assert s["skipped"] == {"warmup": 2, "growth": 1, "spike": 0, "nan": 0, "other": 4}


def test_spike_skip_and_recovery_are_counted_from_the_event() -> None:
    steps = 140
    scales = [2.0**16] * 121 + [2.0**14, 2.0**15, 2.0**16] + [2.0**16] * 16
    skipped = [False] * steps
    skipped[120] = True
    s = _summary("spike", scales, skipped)
    assert s["skipped"]["spike"] == 1 and s["skipped_total"] == 1
    assert s["lost_factor"] == 4.0
    assert s["steps_to_recover"] == 2  # step 122 runs at 2^15, within 2x of 2^16


@pytest.mark.parametrize("scaler_ahead", [True, False])
def test_targets_compare_headroom_with_gradscaler_seed_by_seed(scaler_ahead: bool) -> None:
    def run(scaler: str, seed: int, total: int, loss: float) -> dict:
        kinds = {"warmup": 0, "growth": total, "spike": 0, "nan": 0, "other": 0}
        return {
            "model": "cnn",
            "scenario": "clean",
            "scaler": scaler,
            "seed": seed,
            "skipped": kinds,
            "skipped_total": total,
            "underflow_fraction": 1e-3,
            "underflow_fraction_after_step0": 1e-3,
            "final_loss": loss,
        }

    mine = 3 if scaler_ahead else 0
    runs = [run("gradscaler", 0, 2, 1.0), run("gradscaler", 1, 2, 1.2), run("headroom", 0, mine, 1.05)]
    runs.append(run("headroom", 1, 0, 1.25))
    checks = {c.name: c for c in bench_scaler.check_targets(runs)}
    assert checks["never more skips than GradScaler on any run"].passed is not scaler_ahead
    assert checks["at most half of GradScaler's skips over all runs"].passed is not scaler_ahead
    # headroom - GradScaler = +0.05 per seed; GradScaler's seed-to-seed spread (population std) is 0.1.
    assert checks["cnn/clean: final loss no worse than GradScaler's beyond the spread"].passed
