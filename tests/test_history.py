"""The run's history (amp_inspect/diagnosis/history.py): StepRecords read from run logs, and what the summary makes of
them."""

from __future__ import annotations

from amp_inspect.diagnosis.history import StepRecord

# ---- steps with NaN/Inf and no enabled scaler ----


def test_old_logs_no_scaler_skips_read_as_poisoned() -> None:
    # Written before "poisoned" existed: a no-scaler NaN step was called "skipped".
    old = {"step": 3, "scale": None, "skipped": True, "offenders": ["a"], "total_norm": "nan"}
    record = StepRecord.from_log_record(old)
    assert record.poisoned and not record.skipped
    scaled = StepRecord.from_log_record({**old, "scale": 1024.0})
    assert scaled.skipped and not scaled.poisoned
