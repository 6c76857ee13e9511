"""Writes OUT/summary.json from a bench/gpu_check.sh run and exits with the run's status: each stage's status
(passed, failed, timeout, not-run with the reason, skipped for the budget), seconds and cap, the caps against
the budget, the machine, the benchmarks' ratios and target checks, and the launches per call. Reads only what
the run wrote; a stage that did not run or wrote nothing shows as such. Imports no torch.

Exit status: 0 every stage ran and passed; 1 a stage failed or ran out of its cap; 3 nothing measured (no
stage past the install ran); 4 none failed but some did not run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ALL_PASSED, A_STAGE_FAILED, NOTHING_MEASURED, SOME_NOT_RUN = 0, 1, 3, 4
BENCH_FILES = ("tensor_stats_cuda", "step_cuda")


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
    plan = dict(line.split("\t", 1) for line in (out / "plan.tsv").read_text().splitlines())
    caps = {item.split(":")[0]: int(item.split(":")[1]) for item in plan.get("caps", "").split()}
    return {"budget_s": int(plan.get("budget", 0)), "caps_s": caps, "caps_total_s": sum(caps.values()), **plan}


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
    for name in BENCH_FILES:
        path = out / f"{name}.json"
        if not path.exists():
            summary[name] = "not written"
            continue
        result = json.loads(path.read_text())
        summary[name] = {
            "targets": result.get("targets"),
            "ratios": [
                {k: m.get(k) for k in ("set_name", "method", "median_ms", "gb_per_s", "x_roofline")}
                for m in result.get("measurements", [])
            ],
            "launches": result.get("launches"),
        }
    return summary


def main(out: Path) -> int:
    summary = summarize(out)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, s in summary["stages"].items():  # type: ignore[union-attr]
        print(f"{name:<11} {s['status']:<8} {s['seconds']:>4}s (cap {s['cap_s']}s) {s['note']}")
    words = {0: "every stage passed", 1: "a stage failed", 3: "nothing measured", 4: "some stages did not run"}
    print(f"exit {summary['exit_status']}: {words[summary['exit_status']]}; {out / 'summary.json'}")  # type: ignore[index]
    return summary["exit_status"]  # type: ignore[return-value]


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
