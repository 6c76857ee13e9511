"""The run log: one JSON line per inspected training step, appended as the run goes (``log="run.jsonl"``).

Record schema, as the Inspector writes it (one line per inspected step)::

    {"schema": 1, "log": "amp_inspect", "time": float, "step": int,
     "scale": float | null,            # GradScaler scale, null without a scaler
     "skipped": bool,                  # an enabled GradScaler skipped the step (non-finite gradients)
     "poisoned": bool,                 # non-finite gradients and no enabled GradScaler: the optimizer applied them
                                       # (absent in older logs, whose "skipped" with a null scale means this)
     "total_norm": float,              # gradient norm over all inspected modules
     "offenders": [module names],      # modules with NaN/Inf gradients, most first
     "headroom": {"up": int, "down": int},
     "modules": {name: {"numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal", "underflow",
                        "amax", "grad_norm"}},  # the fields statistics.module_record_fields lists
     "first_nonfinite": str,           # optional: the first module whose activations went non-finite
     "sparse_modules": [module names], # optional: modules with sparse gradients (numel counts stored values)
     "scale_problem": str,             # optional: the loss scale is not a finite positive number
     "scale_decision": {"scale": float, "previous": float, "reason": str, "skip": str | null, "margin": int,
                        "room": int | null, "room_from": str | null, "offenders": [module names],
                        "policy": str},  # optional: a ScalePolicy's next scale and why, and the policy's name
                                       # (amp_inspect/scaling/policies.py; no "policy": an older log, "headroom"); a
                                       # log whose records carry it was written under that policy
                                       # (amp_inspect/scaling/timeline.py)
     "inf_by_rank": {rank: {module: count}},  # distributed runs only: NaN/Inf per rank and module
     "inf_origin": "before_allreduce" | "shards",  # with inf_by_rank: DDP ranks' own gradients / FSDP2 shards
     "readiness": {"recipes": [recipe names], "modules": {name: {operand: {...}}}},  # optional: readiness_every
                                       # steps, each operand's format-readiness statistics (readiness/report.py)
     "update": {"modules": {name: {"numel_with_grad", "lost", "lost_fraction", "update_ratio",
                                   "state_underflow", "weight_amax", ...}}, "skipped": bool},  # optional:
                                       # update_every steps, what optimizer.step() did (updates/report.py)
     "weights": {"into_step": int, "nonfinite": {module: count}, "partial": str},  # optional: after NaN/Inf
                                       # gradients, a read of the parameters: the NaN/Inf elements of each module's
                                       # weights as step into_step's forward used them ({} when all finite;
                                       # "partial": why only this rank's shards were read) (evidence/weights.py)
     "clip_norm": float,               # optional: the norm the training loop clips the gradients to (a trainer's
                                       # setting, or insp.clip_grad_norm_'s max_norm)
     "hist": {name: sparse hist}}      # optional, on steps where ``RunLog.wants_hist(step)``

A sparse hist is ``sparse_hist(row)`` of the 256-bin exponent histogram defined in amp_inspect/core/tensor_stats.py:
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
warning, and a new ``RunLog`` on the same file (a resumed run) removes it before appending. A write that
fails part-way (disk full) and a loop that goes on leave a torn line in the middle: the writer starts its
next line on a fresh line, and ``read_log`` skips any invalid line (torn, garbage, fields of the wrong type)
with one warning naming the line numbers, and returns every valid record.

One writer per file: a ``RunLog`` holds an exclusive advisory lock (``fcntl.flock``) on its file from open to
close, and a second ``RunLog`` on the same file (this process or another, through any path) is refused with
``LogInUseError`` before it writes or cuts anything. This process's own RunLogs are known by the file's device
and inode, so a second one here is refused also where the file system has no locks (NFS without them: then
only other processes go unseen, which a warning says). A forked child (a DataLoader worker) closes its copies
of the open logs at the fork, so the lock goes with the parent's close() and not with the child's end. The
torn-tail repair runs only under that lock, so it never cuts another writer's line in progress. In a
distributed run the Inspector logs on rank 0 only (every rank holds the same report), or to one file per rank
with ``log_all_ranks=True``. A log deleted or replaced while it is written is said once (RuntimeWarning).

Other people's files: a ``RunLog`` only appends to a file that is empty or recognisably a run log: its first
line names this writer and schema (every line starts ``{"schema":1,"log":"amp_inspect",``, also when torn),
or is a whole valid record of schema 1 (logs written before lines carried the name); a file whose first
64 MiB end no line (blank or not) is no run log. Anything else (a
checkpoint, a text file, another tool's JSONL with a "schema" field, a directory, a FIFO) is refused with a
ValueError before anything is written or cut, so ``log=`` pointed at the wrong path never modifies that
file. ``read_log`` drops the ``"log"`` marker from the records it returns.

Why over 600 lines: the writer and the reader share the line format, the field tables and the rules that
recognise a run log; apart, every change to the format would touch both halves.

This module imports no torch, and of the package only the torch-free formats and statistics, so reading a log
is cheap.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; one writer per file is then the user's to keep
    fcntl = None  # type: ignore[assignment]

from amp_inspect.core import statistics
from amp_inspect.core.formats import HIST_BINS

SCHEMA_VERSION = 1

# Fields whose values are floats and may be non-finite; read_log decodes "nan"/"inf"/"-inf" under these keys
# and inside the per-module records of "modules". amin_nonzero is +inf by definition when nothing is nonzero.
# "previous" is the scale a step ran at, inside "scale_decision" (a broken scale is non-finite there too).
# The statistics' own float fields come from the schema of statistics (amp_inspect/core/statistics.py).
FLOAT_FIELDS = frozenset({"scale", "previous", "total_norm"}) | statistics.FLOAT_FIELDS
# The fields whose integers are read as floats (JSON tools such as jq write 32768.0 as 32768).
_FLOAT_KEYS = FLOAT_FIELDS | {"recommended_scale", "clip_norm", "time", "sq_change", "sq_weight", "weight_amax"}
_MODULES_KEY = "modules"
_STR_TO_FLOAT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_TAIL_SCAN_CHUNK = 1 << 16  # bytes read per step when looking back for the last newline of an existing log
# Every line RunLog writes starts with these bytes (json.dumps keeps "schema" first, compact separators): how an
# existing file is recognised as a run log before anything is appended to it or cut from it.
_LINE_START = b'{"schema":'
# Every line RunLog writes names the writer right after the version (json.dumps keeps insertion order):
# {"schema":1,"log":"amp_inspect",... A file is ours when its first line starts so (also when torn).
WRITER_NAME = "amp_inspect"
_NAMED_START = re.compile(rb'\{"schema":([0-9]{1,9}),"log":"' + WRITER_NAME.encode() + rb'"[,}]')
_LEGACY_START = b'{"schema":1,'  # how every line started before lines named the writer
_MAX_FIRST_LINE = 1 << 26  # bytes read at most to find an existing file's first line (records are far smaller)
_MAX_INT = 2**63  # counts and steps are int64 wherever they are used (numpy, torch)
_MAX_STEP = 2**53  # steps are exact in float64 (plots, JSON readers in other languages)
_MAX_HEADROOM = 1024  # doublings or halvings: beyond float64's exponent range a headroom means nothing
_UP_DOWN = ("up", "down")  # the keys of "headroom"
_COUNT_FIELDS = statistics.MODULE_COUNT_FIELDS  # checked under their own keys only (not "overflow/bf16")
_GLUED = "torn, followed by a whole record"  # read_log: a line whose torn start was skipped, its record read
_LISTED_BAD_LINES = 5  # invalid lines named one by one in read_log's warning
# Sums of squares over finite elements (the readiness op's sq_signal and sq_error, the update op's sq_change and
# sq_weight): float64 sums of squares of 16- and 32-bit values, so finite and 0 or more in every log the inspector
# writes. Anything else was written by hand, and would reach the readers' square roots and logarithms.
_SQUARE_SUMS = tuple(s.name for s in (*statistics.READINESS, *statistics.UPDATE) if s.output == "sums")


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
    try:
        # UnicodeDecodeError is a ValueError too; so are Infinity, NaN and 1e400, which the writer never writes
        record = json.loads(raw.decode("utf-8"), parse_constant=_no_float, parse_float=_finite_float)
    except RecursionError:  # deeply nested arrays or objects: not a record of ours, and no crash
        raise ValueError("nested too deeply") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    return record


def _is_weights(value: object) -> bool:
    """A well-formed "weights" entry (evidence/weights.py's WeightsSeen.to_record)."""
    if not isinstance(value, dict):
        return False
    counts = value.get("nonfinite")
    return (
        _is_int(value.get("into_step"), -_MAX_STEP)
        and isinstance(counts, dict)
        and all(_is_int(n, 1) for n in counts.values())
        and isinstance(value.get("partial", ""), str)
    )


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _is_headroom(value: Any) -> bool:
    return value is None or (_is_int(value) and abs(value) < _MAX_HEADROOM)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(value: Any, low: int = -_MAX_INT) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < _MAX_INT


def _is_decision(value: Any) -> bool:
    """Whether ``value`` is a "scale_decision" of the schema: every field present, each of its type."""
    return (
        isinstance(value, dict)
        and all(_is_number(value.get(k)) for k in ("scale", "previous"))
        and isinstance(value.get("reason"), str)
        and (value.get("skip") is None or isinstance(value.get("skip"), str))
        and _is_int(value.get("margin"))
        and _is_headroom(value.get("room"))
        and (value.get("room_from") is None or isinstance(value.get("room_from"), str))
        and isinstance(value.get("offenders"), list)
        and all(isinstance(m, str) for m in value["offenders"])
        and all(k in value for k in ("skip", "room", "room_from"))
        and isinstance(value.get("policy", ""), str)
    )


def _check_square_sums(values: Mapping[str, Any], where: str) -> None:
    """ValueError naming the first of ``values``' sums of squares (``_SQUARE_SUMS``, a number or a list of them)
    that is not a finite number of 0 or more; ``where`` says whose they are."""
    for key in _SQUARE_SUMS:
        if key not in values:
            continue  # a missing field is the section's reader's to name
        value = values[key]
        for item in value if isinstance(value, list) else [value]:
            if not (_is_number(item) and 0 <= item < math.inf):
                raise ValueError(f'"{key}" of {where} must be a finite sum of squares (0 or more), got {item!r:.20}')


def _check_sections(record: Mapping[str, Any]) -> None:
    """The sums of squares of the "update" and "readiness" sections (their readers check the rest)."""
    update = record.get("update")
    for name, m in update["modules"].items() if isinstance(update, dict) else ():
        if isinstance(m, dict):
            _check_square_sums(m, f'module {name[:40]!r} in "update"')
    readiness = record.get("readiness")
    for name, operands in readiness["modules"].items() if isinstance(readiness, dict) else ():
        for operand, stats in operands.items() if isinstance(operands, dict) else ():
            if isinstance(stats, dict):
                _check_square_sums(stats, f'module {name[:40]!r} operand {str(operand)[:4]!r} in "readiness"')


def _check_record(record: Mapping[str, Any]) -> None:
    """ValueError naming the first field whose type is not the schema's (see the module docstring).

    Only the fields this package reads are checked, and each only when present, so records of a newer
    schema with fields of their own pass. A module record may lack fields: its readers take a missing count
    as 0 and a missing float as NaN (attribution.count, as render/series.py does). Float fields hold numbers after
    ``_decode`` (non-finite allowed: a NaN gradient has a NaN norm); counts and steps are ints in int64's range.
    The sums of squares of "update" and "readiness" are finite and 0 or more (``_SQUARE_SUMS``).
    """
    if not _is_int(record.get("step"), -_MAX_STEP) or record["step"] >= _MAX_STEP:
        raise ValueError(f'"step" must be an integer below 2^53 in size, got {record.get("step")!r:.40}')
    checks: dict[str, Any] = {
        "time": _is_number,
        "scale": lambda v: v is None or _is_number(v),
        "skipped": lambda v: isinstance(v, bool),
        "poisoned": lambda v: isinstance(v, bool),
        "sparse_modules": lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v),
        "scale_problem": lambda v: v is None or isinstance(v, str),
        "total_norm": _is_number,
        "recommended_scale": lambda v: v is None or _is_number(v),
        "offenders": lambda v: isinstance(v, list) and all(isinstance(m, str) for m in v),
        "formats": lambda v: isinstance(v, list) and all(isinstance(f, str) for f in v),
        "first_nonfinite": lambda v: v is None or isinstance(v, str),
        "inf_origin": lambda v: v is None or isinstance(v, str),
        "hardware_note": lambda v: v is None or isinstance(v, str),
        "hardware": lambda v: v is None or isinstance(v, dict),  # read with plots._float: anything else is NaN
        "headroom": lambda v: v is None or (isinstance(v, dict) and all(_is_headroom(v.get(k)) for k in _UP_DOWN)),
        "scale_decision": lambda v: v is None or _is_decision(v),
        # readiness_report.ReadinessReport.from_record checks the rest where it is read
        "readiness": lambda v: (
            isinstance(v, dict) and isinstance(v.get("recipes"), list) and isinstance(v.get("modules"), dict)
        ),
        # update_report.UpdateStats.from_record checks the rest where it is read
        "update": lambda v: isinstance(v, dict) and isinstance(v.get("modules"), dict),
        "weights": _is_weights,
        "clip_norm": lambda v: v is None or _is_number(v),
        "inf_by_rank": lambda v: (
            isinstance(v, dict)
            and all(
                _is_digits(str(r).removeprefix("-")) and isinstance(m, dict) and all(_is_int(c, 0) for c in m.values())
                for r, m in v.items()
            )
        ),
        "hist": lambda v: (
            isinstance(v, dict)
            and all(
                isinstance(h, dict)
                and all(_is_digits(k) and int(k) < HIST_BINS and _is_int(c, 0) for k, c in h.items())
                for h in v.values()
            )
        ),
    }
    for key, ok in checks.items():
        if key in record and not ok(record[key]):
            raise ValueError(f'"{key}" has the wrong type or value ({record[key]!r:.60})')
    _check_sections(record)
    modules = record.get(_MODULES_KEY)
    if modules is None:
        return
    if not isinstance(modules, dict):
        raise ValueError(f'"{_MODULES_KEY}" must be an object, got {type(modules).__name__}')
    for name, m in modules.items():
        if not isinstance(m, dict):
            raise ValueError(f'"{_MODULES_KEY}" entry {name[:60]!r} must be an object')
        for key, value in m.items():
            if key in _COUNT_FIELDS and not _is_int(value, 0):
                raise ValueError(f"module {name[:60]!r}: {key!r} must be a count, got {value!r:.40}")
            if key in FLOAT_FIELDS and not _is_number(value):
                raise ValueError(f"module {name[:60]!r}: {key!r} must be a number, got {value!r:.40}")


def _no_float(token: str) -> float:
    raise ValueError(f"{token} is not a number of a run log (it writes non-finite floats as strings)")


def _finite_float(token: str) -> float:
    value = float(token)
    if math.isinf(value):  # 1e400: beyond float range, which the writer never writes
        raise ValueError(f"the number {token[:40]} is beyond float range")
    return value


def _fitting(value: Any, where: str) -> Any:
    """``value`` with every integer checked to fit a float (ValueError naming the field), and the integers of the
    float fields as floats: a log passed through ``jq`` holds 32768 where the writer wrote 32768.0."""
    if isinstance(value, dict):
        return {k: _fitting(v, k if k in FLOAT_FIELDS or not where else f"{where}.{k}"[-80:]) for k, v in value.items()}
    if isinstance(value, list):
        return [_fitting(v, where) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            as_float = float(value)
        except OverflowError:
            raise ValueError(f'"{where}" holds an integer beyond float range') from None
        return as_float if where.rsplit(".", 1)[-1] in _FLOAT_KEYS else value
    return value


def _read_record(raw: bytes) -> dict[str, Any]:
    """The decoded, checked record of one line; ValueError saying what is wrong with it."""
    record = _fitting(_decode(_parse_line(raw)), "")
    _check_record(record)
    return record


def _recover_glued(raw: bytes) -> dict[str, Any] | None:
    """A whole record that follows a torn one on the same line (written before the writer could end the torn
    line, e.g. by an older version after a failed write), or None."""
    start = raw.rfind(_LINE_START)
    if start <= 0:
        return None
    try:
        return _read_record(raw[start:])
    except ValueError:
        return None


def _first_line(path: Path) -> tuple[bytes, bool] | None:
    """The first non-blank line of ``path`` (without its newline) and whether it is whole (a newline follows); None
    when the first ``_MAX_FIRST_LINE`` bytes end no such line and more follows (blank or not, no run log of ours
    starts so: a record is far smaller).

    Reading goes on past the first chunk only while all is blank or the line could be a schema-1 record written
    before lines named the writer (that one is judged whole): a checkpoint with no newline costs one chunk. Each
    byte is looked at once (blanks are dropped chunk by chunk, a newline is looked for in the new chunk only).
    """
    head = bytearray()  # the first non-blank line so far (appended to in place: linear)
    read = 0
    with open(path, "rb") as f:
        while chunk := f.read(_TAIL_SCAN_CHUNK):
            if read >= _MAX_FIRST_LINE:
                return None
            read += len(chunk)
            if not head:
                chunk = chunk.lstrip()
            line, newline, _ = chunk.partition(b"\n")
            head += line
            if newline and head:
                return bytes(head), True
            if head and not head.startswith(_LEGACY_START[: len(head)]):
                break  # not one of our lines: the start is enough to judge it
    return bytes(head), False


def _named_version(line: bytes) -> int | None:
    """The schema version of a line that names this writer (``{"schema":N,"log":"amp_inspect",``), or None."""
    match = _NAMED_START.match(line)
    return int(match.group(1)) if match else None


def _our_start() -> bytes:
    return b'{"schema":%d,"log":"%s",' % (SCHEMA_VERSION, WRITER_NAME.encode())


def _is_legacy_record(line: bytes) -> bool:
    """Whether ``line`` is a whole, valid record of schema 1 written before lines carried the writer's name."""
    try:
        record = _read_record(line)
    except ValueError:
        return False
    schema = record.get("schema")
    return type(schema) is int and schema == 1


def _recognise(path: Path) -> str:
    """ "ours", "blank", "newer" (our name, a newer schema) or "foreign", from the first non-blank line."""
    first = _first_line(path)
    if first is None:
        return "foreign"
    line, whole = first
    if not line.strip():
        return "blank"
    version = _named_version(line)
    if version is None and not whole and _our_start().startswith(line):
        return "ours"  # our first line caught mid-write, before it even names the writer
    if version is not None:
        return "ours" if 1 <= version <= SCHEMA_VERSION else "newer"
    return "ours" if whole and _is_legacy_record(line) else "foreign"


def is_run_log(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a regular file whose first non-blank line is one of this writer's: it starts with
    the writer's name and schema version (``{"schema":1,"log":"amp_inspect",``, also when torn), or it is a
    whole valid record of schema 1 (the logs written before lines carried the name). Never opens anything but
    a regular file (a FIFO would block)."""
    path = Path(path).expanduser()
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return False
        return _recognise(path) in ("ours", "newer")
    except OSError:
        return False


def _refuse_unusable(path: Path) -> None:
    """ValueError unless ``path`` is absent or a regular file whose parent is a folder: a directory, a FIFO (whose
    reading blocks), a device or a socket is refused before anything opens it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise ValueError(f"log={str(path)!r}: a part of its parent path is a file, not a folder") from None
    if stat.S_ISDIR(mode):
        raise ValueError(f"log={str(path)!r} is a directory; give a file path such as {str(path / 'run.jsonl')!r}")
    if not stat.S_ISREG(mode):
        raise ValueError(
            f"log={str(path)!r} is not a regular file (a FIFO, device or socket); give a file path, or log=None "
            "for no log"
        )


def _refuse_foreign(path: Path) -> None:
    """ValueError unless ``path`` is absent, blank or recognisably a run log of this schema: never write to
    another file (a checkpoint, a text file, another tool's JSONL) that ``log=`` was pointed at by mistake."""
    _refuse_unusable(path)
    if not path.exists():
        return
    kind = _recognise(path)
    if kind == "newer":
        raise ValueError(
            f"log={str(path)!r} is a run log of a newer amp_inspect (schema above {SCHEMA_VERSION}); refusing to "
            "append older records to it. Give a new file name."
        )
    if kind == "foreign":
        raise ValueError(
            f"log={str(path)!r} exists and is not an amp_inspect run log (its first line is not a run-log "
            "record); refusing to write to it. Give a new file name, or an earlier run log to append to."
        )


def _tail_start(f: BinaryIO) -> int:
    """Offset just past the last newline of the open file (0 when it has none): where a torn tail would start."""
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


def _repair_tail(f: BinaryIO, path: Path, *, may_cut: bool) -> bool:
    """Make an open log end on a line boundary, so appended records do not glue onto a torn line.

    A tail that is a whole record missing only its newline gets the newline; a torn record is cut off (it holds
    nothing ``read_log`` would return) with a RuntimeWarning saying how many bytes went, but only when
    ``may_cut`` (this writer holds the file's lock, so the tail is no other writer's line in progress).
    Returns whether the tail was left torn (the next line must then start with a newline).
    """
    start = _tail_start(f)
    size = f.seek(0, os.SEEK_END)
    if start == size:
        return False
    f.seek(start)
    tail = f.read()
    if tail.strip():
        try:
            _parse_line(tail)
        except ValueError:
            if not may_cut:
                return True
            os.ftruncate(f.fileno(), start)
            warnings.warn(
                f"{path}: removed a torn last line ({size - start} bytes, a run killed mid-write?) before appending",
                RuntimeWarning,
                stacklevel=4,
            )
            return False
    f.write(b"\n")  # a whole record (or blank) missing only its newline
    return False


class LogInUseError(RuntimeError):
    """Another RunLog (in this process or another) is writing the file: one writer per file."""


# The open RunLogs of this process, by (device, inode) of their file: consulted before the file's lock, so a second
# RunLog on the same file is refused also where the file system has no locks (NFS without them).
_OPEN_HERE: dict[tuple[int, int], weakref.ref[RunLog]] = {}


def _in_use(path: Path, who: str) -> LogInUseError:
    return LogInUseError(
        f"log={str(path)!r} is being written by {who}; one writer per file: give each run its own log= path"
    )


def _lock(fd: int, path: Path, key: tuple[int, int]) -> bool:
    """Take the file's exclusive advisory lock without waiting: True when held, False where the file system
    has no locks (then nothing is cut); LogInUseError when another writer holds it (this process's own RunLogs
    are known without the lock)."""
    here = _OPEN_HERE.get(key)
    if here is not None and here() is not None:
        raise _in_use(
            path, "another RunLog in this process (an inspector attached with the same log= and not detached?)"
        )
    if fcntl is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(path, "another process (a second job started with the same log=?)") from None
    except OSError as err:
        if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            return False
        raise
    return True


def _close_in_forked_child() -> None:
    """A forked child (a DataLoader worker) shares each open log's file description, and with it the lock, which
    would outlive the parent's close() while the child lives: the child closes its copies (which leaves the
    parent's lock held, as closing a shared description's duplicate does) and writes no log of the parent's."""
    for ref in list(_OPEN_HERE.values()):
        log = ref()
        if log is not None:
            log._file.close()
    _OPEN_HERE.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_close_in_forked_child)


class RunLog:
    """Appends one JSON line per record to ``path``; see the module docstring for the schema.

    Each ``write`` serialises the record first (so a record that cannot be serialised writes nothing), then
    hands the whole line to the OS in one unbuffered write: a reader sees every line as soon as ``write``
    returns. That costs one system call per record and no host sync. With ``fsync=True`` each write also
    waits for the disk, which survives a machine crash as well as a killed process, at milliseconds a record.

    ``hist_every``: steps between exponent histograms (``wants_hist``); 0 or less turns them off.

    An existing ``path`` must be empty or a run log (ValueError otherwise, before anything is written).
    A write that raises part-way (OSError: disk full) leaves a torn line; the next write starts on a new line,
    so the records after it stay readable.
    """

    def __init__(self, path: str | os.PathLike[str], *, hist_every: int = 100, fsync: bool = False) -> None:
        self.path = Path(path).expanduser()  # "~/runs/x.jsonl" is the home folder's, never a folder named "~"
        self.hist_every = hist_every
        self.fsync = fsync
        self._warned_gone = False
        _refuse_foreign(self.path)  # read-only: a foreign file is refused before it is opened for writing
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ValueError(f"log={str(path)!r}: a part of its parent path is a file, not a folder") from None
        # O_NONBLOCK: a FIFO swapped in after the check above fails to open instead of blocking; a regular file
        # ignores it. Read-write so the tail can be checked and repaired through the same locked descriptor.
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ValueError(f"log={str(path)!r} is not a regular file; give a file path, or log=None for no log")
            self._key = (info.st_dev, info.st_ino)
            self.locked = _lock(fd, self.path, self._key)
            # Unbuffered: FileIO.write is one write(2), and O_APPEND puts each line at the end as a whole.
            self._file = open(fd, "r+b", buffering=0, closefd=True)  # noqa: SIM115 (closed by close())
        except BaseException:
            os.close(fd)
            raise
        try:
            _refuse_foreign(self.path)  # again under the lock: another writer's first line may have landed
            self._torn = _repair_tail(self._file, self.path, may_cut=self.locked)
        except BaseException:
            self._file.close()
            raise
        _OPEN_HERE[self._key] = weakref.ref(self)
        if not self.locked:
            warnings.warn(
                f"{self.path}: this file system has no file locks; make sure no other run writes this log",
                RuntimeWarning,
                stacklevel=2,
            )

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
        if "log" in record:
            raise ValueError(f"\"log\" is the run log's own field (the writer's name, {WRITER_NAME!r})")
        head = {"schema": record.get("schema", SCHEMA_VERSION), "log": WRITER_NAME, "time": record.get("time")}
        if head["time"] is None:
            head["time"] = time.time()
        line = _dumps({**head, **{k: v for k, v in record.items() if k not in head}})
        if self._torn:
            line = b"\n" + line
        self._torn = True  # until the whole line is written
        self._write_all(line)
        self._torn = False
        self._file.flush()  # a no-op for unbuffered files; kept so a buffered file would still be flushed
        if self.fsync:
            os.fsync(self._file.fileno())
        self._check_still_there()

    def _check_still_there(self) -> None:
        """Warn once when the path no longer names the file being written (deleted or replaced mid-run): the
        records go on into the unlinked file and are lost. One stat call per record."""
        if self._warned_gone:
            return
        try:
            info = os.stat(self.path)
            here = (info.st_dev, info.st_ino) == self._key
        except OSError:
            here = False
        if not here:
            self._warned_gone = True
            warnings.warn(
                f"amp_inspect: the run log {self.path} was deleted or replaced while this run was writing it; this "
                "record and the later ones are not in any file at that path",
                RuntimeWarning,
                stacklevel=3,
            )

    def _write_all(self, line: bytes) -> None:
        view = memoryview(line)
        while view:  # a regular file takes the whole line in one call; loop for the rare short write
            written = self._file.write(view)
            view = view[written:]

    def close(self) -> None:
        """Close the file (which releases its lock); closing twice is harmless."""
        entry = _OPEN_HERE.get(self._key)
        if not self._file.closed and entry is not None and entry() in (self, None):
            del _OPEN_HERE[self._key]
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
    """Every valid record of a run log, in order, with ``"nan"``/``"inf"``/``"-inf"`` decoded in the float fields.

    An invalid line (a torn last line of a killed run, a line torn by a failed write in the middle, garbage,
    fields of the wrong type) is skipped, and one RuntimeWarning names the file and the lines skipped; every
    valid record is returned. A file with lines but not one valid record is not a run log: ValueError naming
    the file and its first line's problem. Missing files and directories raise OSError; a FIFO, a device or a
    socket is refused with a ValueError before anything opens it (reading a FIFO with no writer would block).
    Blank lines are skipped. Records from a newer schema are returned as they are, with one RuntimeWarning.
    """
    path = Path(path).expanduser()
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):  # a directory: read_bytes raises IsADirectoryError
        raise ValueError(f"{str(path)!r} is not a regular file (a FIFO, a device or a socket), so not a run log")
    lines = path.read_bytes().split(b"\n")
    if lines[-1] == b"":  # the file ends with a newline (or is empty): nothing follows the last line
        lines.pop()
    records: list[dict[str, Any]] = []
    bad: list[tuple[int, str]] = []  # (line number, why)
    newest = SCHEMA_VERSION
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            record = _read_record(raw)
        except ValueError as err:
            record = _recover_glued(raw)
            bad.append((number, _GLUED if record is not None else str(err)[:120]))
            if record is None:
                continue
        if record.get("log") == WRITER_NAME:
            del record["log"]  # the file format's marker, not a field of the step
        schema = record.get("schema")
        if isinstance(schema, int) and schema > newest:
            newest = schema
        records.append(record)
    if bad and not records:
        number, why = bad[0]
        raise ValueError(f"{path}: not an amp_inspect run log (no valid record; line {number}: {why})")
    if len(bad) == 1 and bad[0][0] == len(lines) and bad[0][1] != _GLUED:
        warnings.warn(
            f"{path}: line {bad[0][0]} is incomplete or invalid (a run killed mid-write?); skipped ({bad[0][1]})",
            RuntimeWarning,
            stacklevel=2,
        )
    elif bad:
        listed = "; ".join(f"line {n} ({why})" for n, why in bad[:_LISTED_BAD_LINES])
        more = f"; and {len(bad) - _LISTED_BAD_LINES} more" if len(bad) > _LISTED_BAD_LINES else ""
        warnings.warn(
            f"{path}: skipped {len(bad)} invalid line{'s' if len(bad) > 1 else ''} of {len(lines)}, read "
            f"{len(records)} records: {listed}{more}",
            RuntimeWarning,
            stacklevel=2,
        )
    if newest > SCHEMA_VERSION:
        warnings.warn(
            f"{path}: records of schema {newest}, newer than this reader's {SCHEMA_VERSION}; read as they are",
            RuntimeWarning,
            stacklevel=2,
        )
    return records
