"""The run log on disk: the JSONL file (one writer per file, a file is ours only by its first line), ``read_log``,
the histogram encodings of its records, and the hardware samples it carries. Torch-free: reading a run never
loads torch. What renders a log is in render/; what writes an inspector's steps into it is inspection's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.runlog.log import LogInUseError, RunLog, is_run_log, read_log

_MODULE_OF = {
    "read_log": "log",
    "RunLog": "log",
    "LogInUseError": "log",
    "is_run_log": "log",
}
__all__ = sorted(_MODULE_OF)
__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
