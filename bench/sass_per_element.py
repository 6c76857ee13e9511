"""SASS instructions per element of the CUDA statistics kernel's vector loops, read from a compiled object
without a GPU (bench/README.md, "The CUDA kernel: registers and instructions").

For every statistics-kernel variant (mode x number of formats) and every loop that holds 16-byte global
loads, prints the loop body's instruction count (static), and the count less the blocks that forward
branches inside the loop skip (the common path: no NaN/Inf to split, squares summed in float32), each
divided by the elements the loop handles (its shared-memory histogram atomics, one per element).

    nvcc -O3 -gencode arch=compute_90,code=sm_90 -c csrc/tensor_stats_cuda.cu -o /tmp/k.o <torch includes>
    python bench/sass_per_element.py /tmp/k.o [--cuobjdump PATH]

cuobjdump: CUDA's own, or the one in triton's wheel (triton/backends/nvidia/bin/cuobjdump).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

MODES = ("plain", "scaled", "unscale")
LOAD = re.compile(r"\bLDG?\.E\.128")
BRANCH = re.compile(r"\bBRA\b\s+(0x[0-9a-f]+)")


def default_cuobjdump() -> str:
    try:
        import triton

        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return "cuobjdump"


def loops(function_sass: str) -> set[tuple[int, int, int, int]]:
    """(elements, loads, static instructions, common-path instructions) of each backward-branch loop."""
    instrs = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", function_sass)]
    found = set()
    for addr, text in instrs:
        match = BRANCH.search(text)
        if not match or int(match.group(1), 16) >= addr:
            continue
        start = int(match.group(1), 16)
        body = [(a, x) for a, x in instrs if start <= a <= addr]
        loads = sum(bool(LOAD.search(x)) for _, x in body)
        elements = sum("ATOMS" in x for _, x in body)
        if not loads or not elements:
            continue
        skipped: set[int] = set()
        for a, x in body:
            inner = BRANCH.search(x)
            if inner and a < int(inner.group(1), 16) <= addr:
                skipped |= {c for c, _ in body if a < c < int(inner.group(1), 16)}
        found.add((elements, loads, len(body), len(body) - len(skipped)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("object", help="a cubin-holding object or library (e.g. the nvcc output of the .cu)")
    parser.add_argument("--cuobjdump", default=default_cuobjdump())
    args = parser.parse_args()
    try:
        done = subprocess.run([args.cuobjdump, "-sass", args.object], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError) as error:
        said = getattr(error, "stderr", None) or error
        print(f"error: {args.cuobjdump} -sass {args.object} failed: {str(said).strip()}")
        return 2
    sass = done.stdout
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = function.split("\n", 1)[0].strip()
        variant = re.search(r"stats_kernelILi(\d)ELi(\d)E", name)
        if not variant:
            continue
        mode, formats = MODES[int(variant.group(1))], variant.group(2)
        for elements, loads, static, common in sorted(loops(function)):
            print(
                f"{mode:8} formats={formats} loads={loads} elements={elements:2}: "
                f"static {static / elements:5.1f}/element, common path {common / elements:5.1f}/element"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
