"""``amp-inspect`` (also ``python -m amp_inspect``): the command line.

amp-inspect demo                 train a small GPT into trouble and watch amp_inspect find it
amp-inspect report LOG -o FILE   one self-contained HTML report (with PNG plots) from a run log
                                 (existing outputs only with --force; a run log never)
amp-inspect summary LOG          skip rate, scale events, offenders and advice from a run log
amp-inspect readiness LOG        per module and GEMM operand, what FP8 / MXFP8 / MXFP4 / NVFP4 would lose
amp-inspect updates LOG          per module, what the optimizer's measured steps did (lost updates, update ratio)
amp-inspect doctor [--log LOG]   check the environment (and a run) for classic AMP mistakes
amp-inspect bench                the fused pass against one read of the gradients and Python checks
amp-inspect info                 what was built and whether a GPU is visible
"""

from __future__ import annotations

import argparse
import contextlib
import json
import runpy
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from amp_inspect.core.printable import shown_name

if TYPE_CHECKING:
    from amp_inspect.diagnosis.findings import Finding
    from amp_inspect.diagnosis.history import Summary

SOURCE_BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_tensor_stats.py"


def _error_text(error: BaseException, path: Path | None) -> str:
    """One line for an error about a file: what went wrong, naming the file."""
    if isinstance(error, IsADirectoryError):
        return f"{error.filename or path}: is a directory, not a file"
    if isinstance(error, FileNotFoundError):
        return f"{error.filename or path}: no such file"
    if isinstance(error, OSError) and error.strerror:
        return f"{error.filename or path}: {error.strerror}"
    text = " ".join(str(error).split()) or type(error).__name__  # one line, whatever the message held
    if path is None or str(path) in text or isinstance(error, FileExistsError):  # the latter names its outputs
        return text
    return f"{path}: {text}"


@contextlib.contextmanager
def _one_line_warnings(command: str) -> Iterator[None]:
    """Warnings (a log's skipped lines, say) printed as one line each on stderr, without Python's source line."""
    with warnings.catch_warnings(record=True) as caught:  # the filters in force decide what is shown
        try:
            yield
        finally:
            for w in caught:
                text = shown_name(" ".join(str(w.message).split()), limit=None)
                print(f"amp-inspect {command}: warning: {text}", file=sys.stderr)


def _file_command(command: str, path_of: Callable[[argparse.Namespace], Path | None]):
    """Wraps a command that reads a run log: unreadable, invalid or refused files end in one line on stderr
    naming the file, and exit code 2 (no traceback)."""

    def wrap(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        def run(args: argparse.Namespace) -> int:
            with _one_line_warnings(command):
                try:
                    return func(args)
                except (OSError, ValueError) as error:  # UnicodeError, json's errors and ours are ValueErrors
                    text = shown_name(_error_text(error, path_of(args)), limit=None)
                    print(f"amp-inspect {command}: {text}", file=sys.stderr)
                    return 2

        return run

    return wrap


def _demo(args: argparse.Namespace) -> int:
    from amp_inspect.cli.demo import run

    run(args.steps, args.out, args.trouble_from)
    return 0


@_file_command("report", lambda args: args.log)
def _report(args: argparse.Namespace) -> int:
    try:
        from amp_inspect.render.html_report import write_report
    except ImportError as error:
        print(f"amp-inspect report needs matplotlib: pip install amp_inspect[report] ({error})", file=sys.stderr)
        return 2
    out = args.output or Path(args.log).with_name("report.html")
    print(f"wrote {write_report(args.log, out, force=args.force)}")
    return 0


@_file_command("summary", lambda args: args.log)
def _summary(args: argparse.Namespace) -> int:
    from amp_inspect.diagnosis.history import StepRecord, summarize
    from amp_inspect.render.console import print_summary
    from amp_inspect.runlog.log import read_log

    records = read_log(args.log)
    if not records:
        print(f"{args.log}: no inspected step in the log")
        return 1
    history = [StepRecord.from_log_record(r) for r in records]
    if getattr(args, "json", False):
        from amp_inspect.diagnosis.doctor import doctor

        report = doctor(history=history)
        print(json.dumps(report.to_json(**run_facts(summarize(history))), indent=1))
        return 0
    print_summary(summarize(history), records[-1])
    return 0


def run_facts(summary: Summary) -> dict[str, Any]:
    """The run's own facts in the findings document of ``summary --json``: the counts, the weights' poisoning,
    where the NaN/Inf started."""
    return {
        "steps": summary.steps,
        "skipped": summary.skipped,
        "poisoned": summary.poisoned,
        "autocast": summary.autocast,
        "loss_scaler": summary.policy if summary.scaler else None,
        "weights_poisoned": summary.weights.to_json() if summary.weights is not None else None,
        "top_offender": summary.top_offender,
    }


T = TypeVar("T")


def _chosen_step(items: Sequence[T], log: Path, step: int | None, none: str, what: str) -> T | None:
    """The item of a log's steps that ``--step`` names (the last one without it); None after printing why not:
    ``none`` when the log has none (how to get them), else that no ``what`` is at that step."""
    if not items:
        print(f"{shown_name(str(log), limit=None)}: {none}", file=sys.stderr)
        return None
    if step is None:
        return items[-1]
    chosen = [item for item in items if getattr(item, "step", None) == step]
    if not chosen:
        shown = ", ".join(str(getattr(item, "step", "?")) for item in items[-5:])
        print(f"{shown_name(str(log), limit=None)}: no {what} at step {step} (the last ones: {shown})", file=sys.stderr)
        return None
    return chosen[0]


@_file_command("readiness", lambda args: args.log)
def _readiness(args: argparse.Namespace) -> int:
    from amp_inspect.readiness.report import from_log
    from amp_inspect.runlog.log import read_log

    none = "no readiness table in this log (attach with readiness_every=N to measure one every N steps)"
    table = _chosen_step(from_log(read_log(args.log)), args.log, args.step, none, "readiness table")
    if table is None:
        return 1
    print("\n".join(table.lines(args.recipes.split(",") if args.recipes else None)))
    return 0


@_file_command("updates", lambda args: args.log)
def _updates(args: argparse.Namespace) -> int:
    from amp_inspect.core.table import fixed_width
    from amp_inspect.runlog.log import read_log
    from amp_inspect.updates.report import ROW_HEADERS, from_log, overview

    steps = from_log(read_log(args.log))
    none = "no optimizer statistics in this log (attach with optimizer=opt, update_every=N to measure every N-th step)"
    chosen = _chosen_step(steps, args.log, args.step, none, "measured optimizer step")
    if chosen is None:
        return 1
    if args.step is not None:
        print("\n".join(chosen.lines()))
        return 0
    run = overview(steps)
    if run is None:
        print(f"{args.log}: every measured optimizer step was skipped (NaN/Inf gradients): nothing changed")
        return 0
    print(run.headline())
    print("\n".join(fixed_width(ROW_HEADERS, [[shown_name(c) for c in row] for row in run.rows()])))
    return 0


def _bench(args: argparse.Namespace) -> int:
    if SOURCE_BENCH.exists() and not args.builtin:  # a source checkout: the full benchmark
        sys.argv = [str(SOURCE_BENCH), "--device", args.device, *(["--quick"] if args.quick else [])]
        runpy.run_path(str(SOURCE_BENCH), run_name="__main__")
        return 0
    import torch

    from amp_inspect.cli.baselines import compare

    # Installed without the source tree: the same comparison on a GPT-2-style gradient set (76 tensors).
    g = torch.Generator().manual_seed(0)
    block = [(384,), (384,), (1152, 384), (1152,), (384, 384), (384,), (384,), (384,), (1536, 384), (1536,)]
    block += [(384, 1536), (384,)]
    shapes = [(8192, 384), (256, 384), *block * 6, (384,), (384,)]
    grads = [(torch.randn(s, generator=g) * 1e-3).to(args.device) for s in shapes]
    ms = compare(grads)
    print(f"{len(grads)} gradient tensors, {sum(t.numel() for t in grads):,} values on {args.device}")
    for name, value in ms.items():
        print(f"  {name:<18} {value:8.2f} ms  ({value / ms['foreach_norm']:.2f}x one read pass)")
    return 0


DOCTOR_DESCRIPTION = (
    "Checks this machine for mixed-precision training (torch build, GPUs, TF32, amp_inspect's compiled kernels) "
    "and, with --log, a run's loss-scale history and hardware readings, and says how to fix what it finds."
)


def add_doctor_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The doctor's description and options on the ``doctor`` sub-parser (defined only here: the doctor itself,
    amp_inspect/diagnosis/doctor.py, knows no command line); ``args.func(args)`` then runs it."""
    from amp_inspect.cli.argtypes import count as count_arg
    from amp_inspect.diagnosis.history import COLLAPSE_SKIPS  # torch-free: building the parser does not load torch

    parser.description = DOCTOR_DESCRIPTION
    parser.add_argument("--log", metavar="RUN.jsonl", help="a run log written by attach(..., log=...)")
    parser.add_argument(
        "--collapse-skips",
        type=count_arg(1),
        default=COLLAPSE_SKIPS,
        metavar="N",
        help=f"skipped steps in a row that count as a loss-scale collapse (default {COLLAPSE_SKIPS})",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings as well as errors")
    parser.add_argument(
        "--json", action="store_true", help="print the findings as one JSON document (docs/usage.md: its schema)"
    )
    parser.set_defaults(func=_file_command("doctor", lambda args: args.log)(_doctor))
    return parser


def _doctor(args: argparse.Namespace) -> int:
    """The environment checks, and with --log the run's history and hardware readings; prints the report.
    Exit 1 on an error (with --strict, on a warning too), 2 when the log cannot be read."""
    import torch

    from amp_inspect.diagnosis.environment_checks import check_environment
    from amp_inspect.diagnosis.findings import DoctorReport

    header = [f"environment: torch {torch.__version__}, python {sys.version.split()[0]}"]
    findings = check_environment()
    if args.log is not None:
        try:
            log_header, log_findings = _doctor_log(args.log, args.collapse_skips)
        except (OSError, ValueError) as error:
            text = shown_name(_error_text(error, Path(args.log)), limit=None)
            print(f"amp-inspect doctor: cannot read {text}", file=sys.stderr)
            return 2
        header += log_header
        findings += log_findings
    report = DoctorReport(findings, header)
    print(json.dumps(report.to_json(), indent=1) if args.json else report)
    failing = report.errors or (args.strict and report.warnings)
    return 1 if failing else 0


def _doctor_log(path: str, collapse_skips: int) -> tuple[list[str], list[Finding]]:
    """The header line and the findings of a run log: its history's and its hardware readings'."""
    from amp_inspect.core.printable import plural
    from amp_inspect.diagnosis.doctor import doctor
    from amp_inspect.diagnosis.environment_checks import log_hardware_findings
    from amp_inspect.diagnosis.findings import Finding
    from amp_inspect.diagnosis.history import StepRecord
    from amp_inspect.runlog.log import read_log

    records = read_log(path)
    history = [StepRecord.from_log_record(r) for r in records if "step" in r]
    skipped = sum(r.skipped for r in history)
    header = [f"run log {path}: {plural(len(history), 'inspected step')}, {skipped} skipped"]
    if not history:
        return header, [Finding("empty-log", "info", f"{path} holds no step records yet")]
    return header, doctor(history=history, collapse_skips=collapse_skips).findings + log_hardware_findings(records)


def _info(args: argparse.Namespace) -> int:
    from amp_inspect.cli.info import main as info_main

    info_main()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="amp-inspect",
        description="amp_inspect: numerics inspector for PyTorch mixed-precision training",
        epilog=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="train a small GPT into trouble and watch amp_inspect find it")
    from amp_inspect.cli.argtypes import add_demo_arguments

    add_demo_arguments(demo)
    demo.set_defaults(func=_demo)

    report = sub.add_parser("report", help="HTML report with plots from a run log")
    report.add_argument("log", type=Path, help="a run log written with attach(..., log=PATH)")
    report.add_argument("-o", "--output", type=Path, help="HTML file (default: report.html beside the log)")
    report.add_argument(
        "--force", action="store_true", help="overwrite an existing report and its PNGs (a run log never is)"
    )
    report.set_defaults(func=_report)

    summary = sub.add_parser("summary", help="skip rate, scale events, offenders and advice from a run log")
    summary.add_argument("log", type=Path)
    summary.add_argument(
        "--json",
        action="store_true",
        help="print the run's facts and the doctor's findings on the log as one JSON document (docs/usage.md)",
    )
    summary.set_defaults(func=_summary)

    readiness = sub.add_parser(
        "readiness", help="per module and GEMM operand, what FP8 / MXFP8 / MXFP4 / NVFP4 would lose (readiness_every)"
    )
    readiness.add_argument("log", type=Path, help="a run log written with attach(..., readiness_every=N, log=PATH)")
    readiness.add_argument("--step", type=int, help="the readiness step to show (default: the last one)")
    readiness.add_argument("--recipes", help="comma-separated recipes to show (default: all)")
    readiness.set_defaults(func=_readiness)

    updates = sub.add_parser(
        "updates", help="per module, what the optimizer's measured steps did (attach with optimizer=, update_every=)"
    )
    updates.add_argument("log", type=Path, help="a run log written with attach(..., optimizer=opt, update_every=N)")
    updates.add_argument("--step", type=int, help="one measured step's table (default: every measured step merged)")
    updates.set_defaults(func=_updates)

    add_doctor_arguments(sub.add_parser("doctor", help="check the environment (and a run log) for AMP mistakes"))

    bench = sub.add_parser("bench", help="time the fused pass against one read of the gradients and Python checks")
    bench.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    bench.add_argument("--quick", action="store_true", help="a short run of the full benchmark")
    bench.add_argument("--builtin", action="store_true", help="the built-in comparison even in a source checkout")
    bench.set_defaults(func=_bench)

    info = sub.add_parser("info", help="what was built and whether a GPU is visible")
    info.set_defaults(func=_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
