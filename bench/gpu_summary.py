"""Writes OUT/summary.json from a bench/gpu_check.sh run and exits with the run's status: the plan (each stage's
cap, kind, whether torch's caching allocator is on, what it runs; the caps against the budget), each stage's
status (passed, failed, timeout, not-run with the reason, skipped for the budget) and seconds, the machine, the
benchmarks' target checks and launches per call, and one table of every timing the benchmarks wrote (``timings``:
file, set, method, whole-call and kernel-only milliseconds and their ratios to the read pass), also written as
OUT/timings.csv. Reads only what the run wrote; a stage that did not run or wrote nothing shows as such. Imports
no torch.

Exit status: 0 every stage ran and passed; 1 a stage failed or ran out of its cap; 3 nothing measured (no
stage past the install ran); 4 none failed but some did not run.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ALL_PASSED, A_STAGE_FAILED, NOTHING_MEASURED, SOME_NOT_RUN = 0, 1, 3, 4
BENCH_FILES = ("tensor_stats_cuda", "step_cuda")  # shown as "not written" when absent: the main results
# One timing row, in the benchmarks' own words: bench_tensor_stats.py's measurements (set_name, x_roofline,
# x_roofline_kernel), bench_readiness.py's and bench_update_kernel.py's rows (set, x_read_median, x_read_kernel).
TIMING_COLUMNS = ("file", "set", "method", "median_ms", "kernel_ms", "x_read", "x_read_kernel")


def read_stages(out: Path) -> dict[str, dict[str, object]]:
    stages: dict[str, dict[str, object]] = {}
    path = out / "stages.tsv"
    for line in path.read_text().splitlines() if path.exists() else []:
        name, status, rc, seconds, cap, note = (line.split("\t") + [""] * 6)[:6]
        stages[name] = {
            "status": status,
            "exit": int(rc) if rc.lstrip("-").isdigit() else None,
            "seconds": int(seconds or 0),
            "cap_s": int(cap) if cap.isdigit() else None,
            "note": note,
        }
    return stages


def exit_status(stages: dict[str, dict[str, object]]) -> int:
    statuses = [s["status"] for s in stages.values()]
    if any(s in ("failed", "timeout") for s in statuses):
        return A_STAGE_FAILED
    if not any(s["status"] == "passed" for name, s in stages.items() if name != "install"):
        return NOTHING_MEASURED
    return SOME_NOT_RUN if any(s != "passed" for s in statuses) else ALL_PASSED


def read_plan(out: Path) -> dict[str, object]:
    """plan.tsv as gpu_check.sh wrote it: ``budget``, ``wheel`` and one ``stage`` line per stage, in order."""
    settings: dict[str, str] = {}
    stages = []
    for line in (out / "plan.tsv").read_text().splitlines():
        key, _, rest = line.partition("\t")
        if key == "stage":
            name, cap, kind, allocator, what = (rest.split("\t") + [""] * 5)[:5]
            stages.append({"name": name, "cap_s": int(cap), "kind": kind, "caching_allocator": allocator, "what": what})
        else:
            settings[key] = rest
    caps = {s["name"]: s["cap_s"] for s in stages}
    return {
        "budget_s": int(settings.get("budget", 0)),
        "wheel": settings.get("wheel"),
        "stages": stages,
        "caps_s": caps,
        "caps_total_s": sum(caps.values()),  # type: ignore[arg-type]
    }


def timing_rows(name: str, result: dict[str, object]) -> list[dict[str, object]]:
    """The timings of one benchmark's JSON as rows of TIMING_COLUMNS (update_stats' rows name no set: its
    weights dtype stands for it)."""
    rows = result.get("measurements") or result.get("rows") or []
    return [
        {
            "file": name,
            "set": row.get("set_name", row.get("set", result.get("weights"))),
            "method": row.get("method"),
            "median_ms": row.get("median_ms"),
            "kernel_ms": row.get("kernel_ms"),
            "x_read": row.get("x_roofline", row.get("x_read_median")),
            "x_read_kernel": row.get("x_roofline_kernel", row.get("x_read_kernel")),
        }
        for row in rows  # type: ignore[union-attr]
        if isinstance(row, dict) and "method" in row
    ]


def summarize(out: Path) -> dict[str, object]:
    stages = read_stages(out)
    code = exit_status(stages)
    summary: dict[str, object] = {
        "exit_status": code,
        "measured": code != NOTHING_MEASURED,
        "plan": read_plan(out) if (out / "plan.tsv").exists() else None,
        "machine": (out / "machine.txt").read_text() if (out / "machine.txt").exists() else None,
        "stages": stages,
    }
    timings: list[dict[str, object]] = []
    results = {path.stem: json.loads(path.read_text()) for path in sorted(out.glob("*.json")) if path.stem != "summary"}
    for name in BENCH_FILES:
        if name not in results:
            summary[name] = "not written"
    for name, result in results.items():
        if "targets" in result or "launches" in result:
            summary[name] = {
                "targets": result.get("targets"),
                "ratios": [
                    {k: m.get(k) for k in ("set_name", "method", "median_ms", "gb_per_s", "x_roofline")}
                    for m in result.get("measurements", [])
                ],
                "launches": result.get("launches"),
                "left_out": result.get("left_out"),
            }
        timings += timing_rows(name, result)
    summary["timings"] = timings
    return summary


def write_timings_csv(timings: list[dict[str, object]], path: Path) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=TIMING_COLUMNS)
        writer.writeheader()
        writer.writerows(timings)


def main(out: Path) -> int:
    summary = summarize(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_timings_csv(summary["timings"], out / "timings.csv")  # type: ignore[arg-type]
    for name, s in summary["stages"].items():  # type: ignore[union-attr]
        print(f"{name:<11} {s['status']:<8} {s['seconds']:>4}s (cap {s['cap_s']}s) {s['note']}")
    words = {0: "every stage passed", 1: "a stage failed", 3: "nothing measured", 4: "some stages did not run"}
    print(f"exit {summary['exit_status']}: {words[summary['exit_status']]}; {out / 'summary.json'}")  # type: ignore[index]
    return summary["exit_status"]  # type: ignore[return-value]


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
