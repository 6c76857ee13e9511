"""The run log: one JSON line per inspected training step, appended as the run goes (``log="run.jsonl"``).

Record schema, as the Inspector writes it (one line per inspected step)::

    {"schema": 1, "time": float, "step": int,
     "scale": float | null,            # GradScaler scale, null without a scaler
     "skipped": bool,                  # an enabled GradScaler skipped the step (non-finite gradients)
     "poisoned": bool,                 # non-finite gradients and no enabled GradScaler: the optimizer applied them
                                       # (absent in older logs, whose "skipped" with a null scale means this)
     "total_norm": float,              # gradient norm over all inspected modules
     "offenders": [module names],      # modules with NaN/Inf gradients, most first
     "headroom": {"up": int, "down": int},
     "modules": {name: {"numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow",
                        "amax", "grad_norm"}},
     "first_nonfinite": str,           # optional: the first module whose activations went non-finite
     "sparse_modules": [module names], # optional: modules with sparse gradients (numel counts stored values)
     "scale_problem": str,             # optional: the loss scale is not a finite positive number
     "scale_decision": {"scale", "previous", "reason", "skip", "margin", "room", "room_from", "offenders"},
                                       # optional: InspectingGradScaler(policy="headroom")'s next scale and why
                                       # (amp_inspect/scale_policy.py)
     "inf_by_rank": {rank: {module: count}},  # distributed runs only: NaN/Inf per rank and module
     "inf_origin": "before_allreduce" | "shards",  # with inf_by_rank: DDP ranks' own gradients / FSDP2 shards
     "hist": {name: sparse hist}}      # optional, on steps where ``RunLog.wants_hist(step)``

A sparse hist is ``sparse_hist(row)`` of the 256-bin exponent histogram defined in amp_inspect/stats.py:
``{"bin": count}`` for the nonzero bins only, bins as string keys because JSON keys are strings.

The writer does not enforce this schema; the Inspector builds the records. ``RunLog.write`` only adds
``"schema"`` and ``"time"`` when a record lacks them.

Non-finite floats: strict JSON has no NaN or Infinity, and a log that ``json.loads`` in other languages (or
``jq``) refuses is no log. So the writer stores float NaN, +Inf and -Inf as the strings ``"nan"``, ``"inf"``
and ``"-inf"``, and ``read_log`` turns those strings back into floats in the float fields only: values under
the keys in ``FLOAT_FIELDS`` and everything inside the ``"modules"`` records. Elsewhere they stay strings, so
a module named ``"inf"`` in ``"offenders"`` stays a name.

Durability: each record reaches the operating system with one ``write`` call of the whole line, so a run
killed at any moment leaves at most one torn line, at the end. ``read_log`` skips such a tail with a
warning, and a new ``RunLog`` on the same file (a resumed run) removes it before appending. One process
writes one file: in a distributed run the Inspector logs on rank 0 only (every rank holds the same
report), or to one file per rank with ``log_all_ranks=True``.

This module imports neither torch nor the rest of the package, so reading a log is cheap.
"""

from __future__ import annotations

import json
import math
import os
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
HIST_BINS = 256  # the float32 exponent field: one bin per value of (bits >> 23) & 0xFF

# Fields whose values are floats and may be non-finite; read_log decodes "nan"/"inf"/"-inf" under these keys
# and inside the per-module records of "modules". amin_nonzero is +inf by definition when nothing is nonzero.
FLOAT_FIELDS = frozenset({"scale", "total_norm", "amax", "grad_norm", "amin_nonzero"})
_MODULES_KEY = "modules"
_STR_TO_FLOAT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_TAIL_SCAN_CHUNK = 1 << 16  # bytes read per step when looking back for the last newline of an existing log


def _nonfinite_str(x: float) -> str:
    if math.isnan(x):
        return "nan"
    return "inf" if x > 0 else "-inf"


def _encode(value: Any) -> Any:
    """``value`` with non-finite floats as strings, tuples as lists, and numpy/torch values as Python values.

    Anything with ``tolist`` (numpy scalars and arrays, torch tensors) is converted with it; for a CUDA
    tensor that copies to the host and waits for the GPU, so hand the writer host values in hot loops.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else _nonfinite_str(value)
    if isinstance(value, (str, int, type(None))):  # bool is an int
        return value
    if isinstance(value, Mapping):
        return {key: _encode(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(item) for item in value]
    if hasattr(value, "tolist"):
        return _encode(value.tolist())
    return value  # json.dumps names the type it cannot serialise


def _decode(value: Any, in_float_field: bool = False) -> Any:
    """Inverse of ``_encode`` for the float fields: the three sentinel strings become floats there only."""
    if isinstance(value, dict):
        return {
            key: _decode(item, in_float_field or key in FLOAT_FIELDS or key == _MODULES_KEY)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_decode(item, in_float_field) for item in value]
    if in_float_field and isinstance(value, str):
        return _STR_TO_FLOAT.get(value, value)
    return value


def _dumps(record: Mapping[str, Any]) -> bytes:
    # allow_nan=False makes a non-finite float that slipped past _encode an error, not an invalid line.
    text = json.dumps(_encode(record), separators=(",", ":"), allow_nan=False, ensure_ascii=False)
    return (text + "\n").encode("utf-8")


def _parse_line(raw: bytes) -> dict[str, Any]:
    """One record from one line; ValueError (json's or ours) when it is not a JSON object."""
    record = json.loads(raw.decode("utf-8"))  # UnicodeDecodeError is a ValueError too
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    return record


def _tail_start(path: Path) -> int:
    """Offset just past the last newline of the file (0 when it has none): where a torn tail would start."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            step = min(_TAIL_SCAN_CHUNK, pos)
            pos -= step
            f.seek(pos)
            newline = f.read(step).rfind(b"\n")
            if newline >= 0:
                return pos + newline + 1
        return 0


def _repair_tail(path: Path) -> None:
    """Make an existing log end on a line boundary, so appended records do not glue onto a torn line.

    A tail that is a whole record missing only its newline gets the newline; a torn record is cut off (it holds
    nothing ``read_log`` would return) with a RuntimeWarning saying how many bytes went.
    """
    if not path.exists():
        return
    start = _tail_start(path)
    size = path.stat().st_size
    if start == size:
        return
    with open(path, "rb") as f:
        f.seek(start)
        tail = f.read()
    try:
        _parse_line(tail)
    except ValueError:
        os.truncate(path, start)
        warnings.warn(
            f"{path}: removed a torn last line ({size - start} bytes, a run killed mid-write?) before appending",
            RuntimeWarning,
            stacklevel=3,
        )
        return
    with open(path, "ab") as f:
        f.write(b"\n")


class RunLog:
    """Appends one JSON line per record to ``path``; see the module docstring for the schema.

    Each ``write`` serialises the record first (so a record that cannot be serialised writes nothing), then
    hands the whole line to the OS in one unbuffered write: a reader sees every line as soon as ``write``
    returns. That costs one system call per record and no host sync. With ``fsync=True`` each write also
    waits for the disk, which survives a machine crash as well as a killed process, at milliseconds a record.

    ``hist_every``: steps between exponent histograms (``wants_hist``); 0 or less turns them off.
    """

    def __init__(self, path: str | os.PathLike[str], *, hist_every: int = 100, fsync: bool = False) -> None:
        self.path = Path(path)
        self.hist_every = hist_every
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _repair_tail(self.path)
        # Unbuffered: FileIO.write is one write(2), and O_APPEND puts each line at the end as a whole.
        self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115 (closed by close())

    @property
    def closed(self) -> bool:
        return self._file.closed

    def wants_hist(self, step: int) -> bool:
        """Whether the record of ``step`` should carry exponent histograms."""
        return self.hist_every > 0 and step % self.hist_every == 0

    def write(self, record: Mapping[str, Any]) -> None:
        """Append ``record`` as one line, with ``"schema"`` and ``"time"`` added when absent. Does not modify it."""
        if self.closed:
            raise ValueError(f"write to a closed RunLog ({self.path})")
        line = _dumps({"schema": SCHEMA_VERSION, "time": time.time(), **record})
        self._write_all(line)
        self._file.flush()  # a no-op for unbuffered files; kept so a buffered file would still be flushed
        if self.fsync:
            os.fsync(self._file.fileno())

    def _write_all(self, line: bytes) -> None:
        view = memoryview(line)
        while view:  # a regular file takes the whole line in one call; loop for the rare short write
            written = self._file.write(view)
            view = view[written:]

    def close(self) -> None:
        """Close the file; closing twice is harmless."""
        self._file.close()

    def __enter__(self) -> RunLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"RunLog({str(self.path)!r}, hist_every={self.hist_every}, fsync={self.fsync}) [{state}]"


def sparse_hist(row: Iterable[int]) -> dict[str, int]:
    """The nonzero bins of a 256-bin histogram row (list, tuple, numpy array or torch tensor) as ``{"bin": count}``.

    A tensor is read with one ``tolist`` (for a CUDA tensor: one copy to the host, which waits for the GPU).
    """
    counts = row.tolist() if hasattr(row, "tolist") else list(row)
    if len(counts) != HIST_BINS:
        raise ValueError(f"a histogram row has {HIST_BINS} bins, got {len(counts)}")
    return {str(b): int(c) for b, c in enumerate(counts) if c}


def dense_hist(sparse: Mapping[str, int]) -> list[int]:
    """The 256 counts of a histogram from its ``sparse_hist`` form (missing bins are 0)."""
    counts = [0] * HIST_BINS
    for key, count in sparse.items():
        b = int(key)
        if not 0 <= b < HIST_BINS:
            raise ValueError(f"histogram bin {key!r} outside 0..{HIST_BINS - 1}")
        counts[b] = int(count)
    return counts


def read_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record of a run log, in order, with ``"nan"``/``"inf"``/``"-inf"`` decoded in the float fields.

    An invalid last line (a run killed mid-write) is skipped with one RuntimeWarning naming the file and line.
    An invalid line before the last is corruption, not a torn tail: ValueError with its line number. Blank
    lines are skipped. Records from a newer schema are returned as they are, with one RuntimeWarning.
    """
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    if lines[-1] == b"":  # the file ends with a newline (or is empty): nothing follows the last line
        lines.pop()
    records: list[dict[str, Any]] = []
    newest = SCHEMA_VERSION
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = _parse_line(raw)
        except ValueError as err:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not a valid record ({err})") from err
            warnings.warn(
                f"{path}: line {number} is incomplete or invalid (a run killed mid-write?); skipped",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        schema = record.get("schema")
        if isinstance(schema, int) and schema > newest:
            newest = schema
        records.append(_decode(record))
    if newest > SCHEMA_VERSION:
        warnings.warn(
            f"{path}: records of schema {newest}, newer than this reader's {SCHEMA_VERSION}; read as they are",
            RuntimeWarning,
            stacklevel=2,
        )
    return records
