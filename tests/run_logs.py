"""Run logs for the tests of the log, the command line and the console: one step's record, a log written
through RunLog, and the skip rule for what needs matplotlib."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

from amp_inspect.runlog.log import RunLog

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
needs_mpl = pytest.mark.skipif(not HAVE_MPL, reason="the report needs matplotlib")


def module_record(nan: int = 0, drop: str = "") -> dict:
    """One module's statistics in a run-log record (``nan`` NaN values; the field ``drop`` left out)."""
    record = {
        "numel": 10,
        "nan": nan,
        "posinf": 0,
        "neginf": 0,
        "zero": 1,
        "overflow": 0,
        "subnormal": 2,
        "underflow": 1,
        "amax": 2.0,
        "grad_norm": 1.0,
    }
    return {k: v for k, v in record.items() if k != drop}


def log_record(step: int, skipped: bool = False, name: str = "layer") -> dict:
    """One step's run-log record with one module ``name`` (NaN in it when ``skipped``)."""
    return {
        "step": step,
        "scale": 1024.0,
        "skipped": skipped,
        "total_norm": math.nan if skipped else 1.0,
        "offenders": [name] if skipped else [],
        "headroom": {"up": 3, "down": 12},
        "modules": {name: module_record(nan=int(skipped))},
        "hist": {name: {"120": 9, "255": int(skipped)}},
    }


def write_log(path: Path, records: list[dict]) -> Path:
    with RunLog(path) as log:
        for r in records:
            log.write(r)
    return path
