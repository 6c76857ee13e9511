"""Writes OUT/summary.json from a bench/gpu_check.sh run: each stage's exit code and seconds, the machine,
the benchmark's ratios and target checks, and the launches per call it counted. Reads only what the run
wrote; a stage that did not run or wrote nothing shows as such."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(out: Path) -> None:
    stages = {}
    for line in (out / "stages.tsv").read_text().splitlines():
        name, rc, seconds = line.split("\t")
        stages[name] = {"exit": rc, "passed": rc == "0", "seconds": int(seconds)}
    summary: dict[str, object] = {
        "machine": (out / "machine.txt").read_text() if (out / "machine.txt").exists() else None,
        "stages": stages,
    }
    for name in ("tensor_stats_cuda", "step_cuda"):
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
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(stages, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
