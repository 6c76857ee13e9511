"""SASS instructions per element of the CUDA statistics kernels' hot loops, read from the compiled sm_90 image
without a GPU, against the targets of issue 19 (bench/README.md, "The CUDA kernel: registers and instructions").

One kernel is compiled per mode (plain / scaled / unscale), format count (1-4) and input dtype. In each, the hot
loop is the loop over full batches (the backward branch whose body holds the most 16-byte global loads). Its
instructions are counted on paths through one iteration, following every branch, out-of-line blocks included:

  common   the shortest iteration: no threshold straddled in the warp, no NaN/Inf, no value near float32's
           limits (every per-batch decision takes its cheap side); this is what the targets are about;
  +1 bound what one straddled threshold adds (the median detour of the per-element branches);
  worst    the longest iteration: every threshold straddled, NaN/Inf and the float64 squares path taken.

Each is divided by the elements of a batch (the loop's histogram atomics, one per element). With a ptxas log
(`-Xptxas -v`, given by --ptxas-log or made by --compile), the spill bytes of every kernel are added up too.

    python bench/sass_per_element.py --compile            # nvcc -O3 for sm_90 into a temporary folder
    python bench/sass_per_element.py OBJECT --ptxas-log LOG [--check]

--check exits 1 when a variant misses its target or any kernel spills. cuobjdump: CUDA's own, or the one in
triton's wheel (triton/backends/nvidia/bin/cuobjdump).

Format readiness's kernels (csrc/readiness/readiness_kernels.cuh, one per input dtype and recipe set: every recipe,
each recipe alone, none), with --readiness: each one's task loop (one warp task: 8 elements per lane, its recipes'
code unrolled; the largest loop with the global loads and no block barrier) is counted statically, every
instruction of its body once, per element. "common" is a build with the lanes' common path alone
(AMPI_READINESS_FAST_PATH_ONLY: judge_element_fast, no NaN/Inf and no float32 subnormal in the lane; its remaining
branches are rare: short or unaligned groups, zero blocks, E8M0 clamps; float64 divisions' slow paths are calls
out of the loop, not counted); "static" the library's build, both paths. A recipe's figure is its own kernel's
(the library's, which a one-recipe call runs), "none" the no-recipe kernel's (loads, counts, squares).

    python bench/sass_per_element.py --readiness [--check]   # nvcc -O3 for sm_90, 2 builds of readiness_cuda.cu

--check (with --readiness) exits 1 when a target is missed (every recipe <= 200, each recipe's kernel <= 60) or a
kernel spills. The first pass that measures a tensor's amax (amax_kernel, one per dtype) is shown too: its hot loop
(as update statistics', below), whose loads must all be 128-bit for --check.

Update statistics' kernel (csrc/update_stats/update_stats_kernels.cuh, one per weight, gradient and exp_avg_sq
dtype), with --update: its hot loop is the innermost loop with the most 16-byte global loads (the loop over units of
8 elements per thread; a build without them, as before issue 33, has one element per iteration: its scalar loop).
Per element: the loop's static body, the shortest path through one iteration (common) and the longest (worst), the
loop's loads and whether all of them are 128-bit, registers and spills, and the budget at which the loop's issue
time stays under its memory time on an H200 (BUDGET_PER_BYTE instructions per byte the element reads).

    python bench/sass_per_element.py --update [--check]   # nvcc -O3 for sm_90 of update_stats_cuda.cu
    python bench/sass_per_element.py --update OBJECT --ptxas-log LOG

--check (with --update) exits 1 when a kernel's hot loop has a load that is not 128-bit, or a kernel spills.
"""

from __future__ import annotations

import argparse
import heapq
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

MODES = ("plain", "scaled", "unscale")
DTYPES = ("fp32", "fp16", "bf16", "fp64")  # csrc/common/numerics.h InputDtype order
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
VECTOR_BYTES = 16  # one 128-bit load (LOAD)
KERNEL = re.compile(r"stats_kernelILi(\d)ELi(\d)ELi(\d)E")
LOAD = re.compile(r"\bLDG\.E(\.\w+)*\.128\b")
ANY_LOAD = re.compile(r"\bLDG\.E\b")
BRANCH = re.compile(r"^(@!?U?P\w+\s+)?BRA(\.\w+)*\s+(0x[0-9a-f]+)")
ENDS = re.compile(r"^(EXIT|RET|BRX|JMX)\b")
REPO = Path(__file__).resolve().parent.parent
# The pipe an opcode issues to (sm_90), for the common path's breakdown: integer ALU (half rate for most),
# float (FMA pipe: float32 at full rate, conversions), memory (loads, stores, atomics) and the rest
# (branches, votes, convergence barriers, uniform-datapath instructions).
PIPES = {
    "mem": ("LDG", "STG", "ATOMS", "ATOMG", "ATOM", "RED", "LDS", "STS", "LDL", "STL", "LD", "ST", "LDC"),
    "fp": (
        "FFMA",
        "FMUL",
        "FADD",
        "FMNMX",
        "FSETP",
        "FSEL",
        "HADD2",
        "HFMA2",
        "HMUL2",
        "F2F",
        "F2FP",
        "DADD",
        "DFMA",
        "DMUL",
        "DSETP",
        "F2I",
        "I2F",
        "MUFU",
    ),
    "int": (
        "IMAD",
        "IADD3",
        "IADD",
        "LOP3",
        "ISETP",
        "SHF",
        "LEA",
        "SEL",
        "PRMT",
        "IMNMX",
        "VIADD",
        "VIMNMX",
        "MOV",
        "IABS",
        "POPC",
        "FLO",
        "P2R",
        "R2P",
        "PLOP3",
        "CS2R",
        "SGXT",
        "BMSK",
        "SHL",
        "SHR",
        "LOP",
    ),
}


def pipe(text: str) -> str:
    opcode = re.sub(r"^@!?U?P\w+\s+", "", text).split(" ")[0].split(".")[0]
    for name, opcodes in PIPES.items():
        if opcode in opcodes:
            return name
    return "other"


def target(dtype: str, mode: str, formats: int) -> float | None:
    """Issue 19's table: fp32 16 + 4 per extra format, 16-bit 14 + 2; scaled as plain; unscale plus 2."""
    if dtype == "fp32":
        base = 16 + 4 * (formats - 1)
    elif dtype in ("fp16", "bf16"):
        base = 14 + 2 * (formats - 1)
    else:
        return None  # float64 has no target: it is judged on the exact 64-bit value
    return base + (2 if mode == "unscale" else 0)


@dataclass
class LoopCount:
    elements: int
    loads: int
    common: int
    one_bound: float | None
    worst: int
    pipes: dict[str, int]


def parse(function_sass: str) -> list[tuple[int, str]]:
    return [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", function_sass)]


def successors(instrs: list[tuple[int, str]]) -> dict[int, list[int]]:
    """Control-flow successors of every instruction (fall-through and branch target)."""
    succ: dict[int, list[int]] = {}
    for i, (addr, text) in enumerate(instrs):
        nxt = [instrs[i + 1][0]] if i + 1 < len(instrs) else []
        match = BRANCH.match(text)
        predicated = text.startswith("@") and not text.startswith("@PT ")
        if match:
            succ[addr] = [int(match.group(3), 16)] + (nxt if predicated else [])
        elif ENDS.match(text):
            succ[addr] = nxt if predicated else []
        else:
            succ[addr] = nxt
    return succ


def innermost_loops(instrs: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(head, tail) by address of each loop (a backward branch) that holds no other."""
    back = []
    for addr, text in instrs:
        match = BRANCH.match(text)
        if match and int(match.group(3), 16) <= addr:
            back.append((int(match.group(3), 16), addr))
    return [
        (head, tail)
        for head, tail in back
        if not any((h, t) != (head, tail) and head <= h and t <= tail for h, t in back)
    ]


def hot_loop(instrs: list[tuple[int, str]]) -> int | None:
    """The head of the innermost loop whose body (by address) holds the most 16-byte global loads (and atomics)."""
    best, best_loads = None, 0
    for head, tail in innermost_loops(instrs):
        loads = sum(bool(LOAD.search(t)) for a, t in instrs if head <= a <= tail)
        atomics = sum("ATOMS" in t for a, t in instrs if head <= a <= tail)
        if atomics and loads > best_loads:
            best, best_loads = head, loads
    return best


def widest_loads_loop(instrs: list[tuple[int, str]]) -> tuple[int, int] | None:
    """(head, tail) of the innermost loop whose body holds the most 16-byte global loads, or (none has any) the most
    global loads of any width."""
    best, best_key = None, (0, 0)
    for head, tail in innermost_loops(instrs):
        body = [t for a, t in instrs if head <= a <= tail]
        key = (sum(bool(LOAD.search(t)) for t in body), sum(bool(ANY_LOAD.search(t)) for t in body))
        if key > best_key:
            best, best_key = (head, tail), key
    return best


def count_loop(instrs: list[tuple[int, str]], head: int, elements: int | None = None) -> LoopCount:
    """Shortest and longest paths through one iteration starting at `head` and ending at an edge back into it.
    Code before the head (the outer loop's) is not part of an iteration. The elements of an iteration are its
    histogram atomics unless given."""
    text = dict(instrs)
    succ = successors(instrs)
    end = -1
    graph = {a: [end if s == head else s for s in succ[a] if s >= head] for a in text if a >= head}
    # Shortest distance from each node to the end (node weight 1): Dijkstra on the reversed graph.
    preds: dict[int, list[int]] = {}
    for a, ss in graph.items():
        for s in ss:
            preds.setdefault(s, []).append(a)
    to_end = {end: 0}
    heap = [(0, end)]
    while heap:
        d, n = heapq.heappop(heap)
        if d > to_end.get(n, 1 << 60):
            continue
        for p in preds.get(n, []):
            if d + 1 < to_end.get(p, 1 << 60):
                to_end[p] = d + 1
                heapq.heappush(heap, (d + 1, p))
    # The shortest iteration, its elements and loads, and the detours of its conditional branches.
    path, node = [], head
    while node != end:
        path.append(node)
        node = min(graph[node], key=lambda s: to_end.get(s, 1 << 60))
    if elements is None:
        elements = sum("ATOMS" in text[a] for a in path)
    loads = sum(bool(LOAD.search(text[a])) for a in path)
    detours = []
    for a in path:
        options = [to_end[s] for s in graph[a] if s in to_end]
        if len(options) == 2 and BRANCH.match(text[a]):
            detour = max(options) - min(options)
            if detour >= max(elements, 1):  # a per-element branch (rarer, shorter branches are bookkeeping)
                detours.append(detour)
    # The longest iteration: memoised depth-first search, edges into nodes on the stack (inner loops) dropped.
    longest: dict[int, int] = {end: 0}
    sys.setrecursionlimit(100000)

    def walk(n: int, stack: set[int]) -> int:
        if n in longest:
            return longest[n]
        stack.add(n)
        best = -(1 << 60)
        for s in graph.get(n, []):
            if s in stack or (s != end and s not in to_end):
                continue
            best = max(best, walk(s, stack))
        stack.discard(n)
        longest[n] = best + 1
        return longest[n]

    worst = walk(head, set())
    one = statistics.median(detours) / elements if detours and elements else None
    pipes = {name: 0 for name in (*PIPES, "other")}
    for a in path:
        pipes[pipe(text[a])] += 1
    return LoopCount(elements, loads, len(path), one, worst, pipes)


def ptxas_kernels(log: str, kernel: re.Pattern) -> list[tuple[re.Match, int, int, int]]:
    """(name match, registers, spill store bytes, spill load bytes) of each kernel ``kernel`` matches, from ptxas -v
    output: the one reading of that output the three kernel families share."""
    found = []
    name = None
    stores = loads = 0
    for line in log.splitlines():
        if "Function properties for" in line:
            name = kernel.search(line)
        elif name and "spill stores" in line:
            numbers = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
            stores, loads = int(numbers.group(1)), int(numbers.group(2))
        elif name and "Used" in line and "registers" in line:
            found.append((name, int(re.search(r"Used (\d+) registers", line).group(1)), stores, loads))
            name = None
    return found


def spills(log: str) -> dict[tuple[str, int, str], tuple[int, int, int]]:
    """(mode, formats, dtype) -> (registers, spill store bytes, spill load bytes), from ptxas -v output."""
    found = {}
    for name, registers, stores, loads in ptxas_kernels(log, KERNEL):
        mode, formats, dtype = (int(g) for g in name.groups())
        found[(MODES[mode], formats, DTYPES[dtype])] = (registers, stores, loads)
    return found


def compile_object(folder: Path) -> tuple[Path, str]:
    from torch.utils.cpp_extension import include_paths

    obj = folder / "tensor_stats_cuda.o"
    command = ["/usr/local/cuda/bin/nvcc", "-O3", "-std=c++20", "-gencode", "arch=compute_90,code=sm_90"]
    command += ["-Xptxas", "-v", "-c", str(REPO / "csrc" / "tensor_stats" / "tensor_stats_cuda.cu"), "-o", str(obj)]
    command += [f"-I{p}" for p in include_paths()] + [f"-I{REPO / 'csrc'}"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return obj, done.stdout + done.stderr


READINESS_KERNEL = re.compile(r"readiness_kernelILi(\d)ELi(\d+)E")
READINESS_DTYPES = ("fp32", "fp16", "bf16")  # csrc/common/numerics.h InputDtype order
READINESS_GROUP = 8  # elements per lane per task (csrc/readiness/readiness.h kReadinessGroupElems)
AMAX_KERNEL = re.compile(r"amax_kernelILi(\d)E")
AMAX_VECTORS_IN_FLIGHT = 4  # csrc/readiness/readiness_kernels.cuh kAmaxVectorsInFlight: 16-byte loads per round
RECIPE_NAMES = (  # amp_inspect/core/recipes.py RECIPES order (csrc/readiness/readiness.h kRecipes)
    "fp8_e4m3_tensor",
    "fp8_e5m2_tensor",
    "fp8_e4m3_block128",
    "mxfp8_e4m3",
    "mxfp8_e5m2",
    "mxfp8_e4m3_rceil",
    "mxfp4",
    "nvfp4",
)
ALL_RECIPES = (1 << len(RECIPE_NAMES)) - 1  # readiness_kernels.cuh kAllRecipes
# Issue 33's targets, common path per element: every recipe, and one recipe's kernel.
READINESS_TARGET_ALL = 200
READINESS_TARGET_ONE = 60


def readiness_task_loop(instrs: list[tuple[int, str]]) -> list[str]:
    """The body of the readiness kernel's task loop: the largest backward-branch range holding a global load and no
    block barrier (the flush, with its barriers, is outside it)."""
    best: list[str] = []
    for addr, text in instrs:
        match = BRANCH.match(text)
        if not match or int(match.group(3), 16) > addr:
            continue
        body = [t for a, t in instrs if int(match.group(3), 16) <= a <= addr]
        if any(LOAD.search(t) for t in body) and not any("BAR.SYNC" in t for t in body) and len(body) > len(best):
            best = body
    return best


def readiness_build(
    folder: Path, cuobjdump: str, common_path: bool, arch: str = "90"
) -> tuple[dict[tuple[str, int], list[str]], dict[str, list[str]], str]:
    """The task-loop bodies per (dtype, recipe mask) of the library's kernels (every recipe: 0xff, each recipe
    alone, none: 0), the amax pass's hot loop per dtype, and the ptxas log of readiness_cuda.cu, built as the library
    is or with the lanes' common path alone."""
    from torch.utils.cpp_extension import include_paths

    obj = folder / f"readiness_{int(common_path)}_{arch}.o"
    command = ["/usr/local/cuda/bin/nvcc", "-O3", "-std=c++20", "-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    command += ["-Xptxas", "-v", f"-DAMPI_READINESS_FAST_PATH_ONLY={int(common_path)}", "-c"]
    command += [str(REPO / "csrc" / "readiness" / "readiness_cuda.cu"), "-o", str(obj)]
    command += [f"-I{p}" for p in include_paths()] + [f"-I{REPO / 'csrc'}"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    sass = subprocess.run([cuobjdump, "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    loops: dict[tuple[str, int], list[str]] = {}
    amax_loops: dict[str, list[str]] = {}  # the amax pass's hot loop, per dtype
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = function.split("\n", 1)[0]
        variant = READINESS_KERNEL.search(name)
        if variant:
            key = (READINESS_DTYPES[int(variant.group(1))], int(variant.group(2)))
            loops[key] = readiness_task_loop(parse(function))
        elif amax := AMAX_KERNEL.search(name):
            instrs = parse(function)
            span = widest_loads_loop(instrs)
            body = [] if span is None else [t for a, t in instrs if span[0] <= a <= span[1]]
            amax_loops[READINESS_DTYPES[int(amax.group(1))]] = body
    return loops, amax_loops, done.stdout + done.stderr


def readiness_registers(log: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(dtype, recipe mask) -> (registers, spill store + load bytes) of the readiness kernels, from ptxas -v."""
    return {
        (READINESS_DTYPES[int(name.group(1))], int(name.group(2))): (registers, stores + loads)
        for name, registers, stores, loads in ptxas_kernels(log, READINESS_KERNEL)
    }


def float64_ops(body: list[str]) -> int:
    return sum(t.split(" ")[0].split(".")[0] in ("DADD", "DMUL", "DFMA") for t in body)


def readiness_main(cuobjdump: str, check: bool = False) -> int:
    """Instructions per element of the readiness kernels' task loop: the every-recipe kernel, the no-recipe kernel
    and each recipe's own kernel (module doc), against issue 33's targets."""
    with tempfile.TemporaryDirectory() as folder:
        library, amax_loops, log = readiness_build(Path(folder), cuobjdump, common_path=False)
        common, _, _ = readiness_build(Path(folder), cuobjdump, common_path=True)
    registers = readiness_registers(log)
    per = {key: len(body) / READINESS_GROUP for key, body in common.items()}
    missed = 0
    print("readiness_kernel task loop, static SASS instructions per element (8 per lane per task)")
    print(
        f"{'dtype':5} {'regs':>4} {'spill B':>7} {'static':>6} {'common':>6} {'none':>5}  "
        f"common by pipe: mem/fp/int/other  calls  (target: common <= {READINESS_TARGET_ALL})"
    )
    for dtype in READINESS_DTYPES:
        body = common[(dtype, ALL_RECIPES)]
        pipes = {name: 0 for name in (*PIPES, "other")}
        for text in body:
            pipes[pipe(text)] += 1
        regs, spilled = registers.get((dtype, ALL_RECIPES), ("-", 0))
        calls = sum("CALL" in t for t in body)
        missed += per[(dtype, ALL_RECIPES)] > READINESS_TARGET_ALL
        print(
            f"{dtype:5} {regs:>4} {spilled:7} {len(library[(dtype, ALL_RECIPES)]) / READINESS_GROUP:6.1f} "
            f"{per[(dtype, ALL_RECIPES)]:6.1f} {per[(dtype, 0)]:5.1f}  "
            + "/".join(f"{n / READINESS_GROUP:.1f}" for n in pipes.values())
            + f"  {calls}"
        )
    print(f"each recipe's own kernel, common path per element (target <= {READINESS_TARGET_ONE}); registers, spills:")
    print(f"{'recipe':18} " + " ".join(f"{d:>6}" for d in READINESS_DTYPES) + "   float64 ops (fp32)  regs  spill B")
    for r, name in enumerate(RECIPE_NAMES):
        mask = 1 << r
        costs = [per[(d, mask)] for d in READINESS_DTYPES]
        missed += max(costs) > READINESS_TARGET_ONE
        doubles = float64_ops(common[("fp32", mask)]) / READINESS_GROUP
        regs = "/".join(str(registers.get((d, mask), ("-", 0))[0]) for d in READINESS_DTYPES)
        spilled = sum(registers.get((d, mask), (0, 0))[1] for d in READINESS_DTYPES)
        print(f"{name:18} " + " ".join(f"{c:6.1f}" for c in costs) + f"   {doubles:17.1f}  {regs}  {spilled}")
    spilled = sum(bytes_ for _, bytes_ in registers.values())
    print(f"ptxas spill bytes (stores + loads), all {len(registers)} readiness kernels: {spilled}")
    missed += spilled > 0
    missed += amax_pass_report(amax_loops, log)
    return 1 if check and missed else 0


def amax_pass_report(loops: dict[str, list[str]], log: str) -> int:
    """Prints the amax pass's hot loop per dtype (loads, instructions per element, registers, spills); returns how
    many kernels miss (a load in the loop that is not 128-bit, or spills)."""
    registers = {
        READINESS_DTYPES[int(name.group(1))]: (regs, stores + loads)
        for name, regs, stores, loads in ptxas_kernels(log, AMAX_KERNEL)
    }
    print("amax_kernel (the first pass, tensor-scaled recipes without a given amax), its hot loop:")
    print(f"{'dtype':5} {'regs':>4} {'spill B':>7} {'128-bit loads / all':>20} {'per element':>11}")
    missed = 0
    for dtype in READINESS_DTYPES:
        body = loops.get(dtype, [])
        wide, every = sum(bool(LOAD.search(t)) for t in body), sum(bool(ANY_LOAD.search(t)) for t in body)
        elements = AMAX_VECTORS_IN_FLIGHT * VECTOR_BYTES // ELEMENT_BYTES[dtype]
        regs, spilled = registers.get(dtype, ("-", 0))
        missed += wide == 0 or wide != every or spilled > 0
        print(f"{dtype:5} {regs:>4} {spilled:7} {f'{wide} / {every}':>20} {len(body) / elements:11.1f}")
    return missed


UPDATE_KERNEL = re.compile(r"update_stats_kernel(?:ILi(n?\d)ELi(n?\d)ELi(n?\d)E)?")
UPDATE_DTYPES = {"0": "fp32", "1": "fp16", "2": "bf16", "n1": "-"}  # csrc/common/numerics.h; n1: kNoState
UPDATE_BYTES = {**ELEMENT_BYTES, "-": 0}
UPDATE_UNIT = 8  # csrc/update_stats/update_stats.h kUpdateUnitElems
# An H200 issues about 132 SMs x 4 schedulers x 32 lanes x 1.98 GHz = 3.3e13 lane-instructions per second and reads
# about 4.8e12 bytes per second: a loop of more than ~7 instructions per byte it reads is bound by issue, not memory.
BUDGET_PER_BYTE = 7


def update_registers(log: str) -> dict[str, tuple[int, int]]:
    """kernel variant ("fp32 fp32 -", or "runtime" for one kernel of all dtypes) -> (registers, spill bytes)."""
    return {
        update_variant(name): (registers, stores + loads)
        for name, registers, stores, loads in ptxas_kernels(log, UPDATE_KERNEL)
    }


def update_variant(match: re.Match) -> str:
    if match.group(1) is None:
        return "runtime"
    return " ".join(UPDATE_DTYPES[g] for g in match.groups())


def update_main(obj: str | None, log: str | None, cuobjdump: str, check: bool) -> int:
    """Instructions per element of update statistics' kernels' hot loop (module doc)."""
    from torch.utils.cpp_extension import include_paths

    with tempfile.TemporaryDirectory() as folder:
        if obj is None:
            obj = str(Path(folder) / "update_stats_cuda.o")
            command = ["/usr/local/cuda/bin/nvcc", "-O3", "-std=c++20", "-gencode", "arch=compute_90,code=sm_90"]
            command += ["-Xptxas", "-v", "-c", str(REPO / "csrc" / "update_stats" / "update_stats_cuda.cu")]
            command += ["-o", obj, *(f"-I{p}" for p in include_paths()), f"-I{REPO / 'csrc'}"]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            log = done.stdout + done.stderr
        sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True, check=True).stdout
    registers = update_registers(log) if log else {}
    print("update_stats_kernel hot loop, SASS instructions per element (weight, grad, exp_avg_sq dtypes)")
    print(
        f"{'weight grad state':17} {'E':>2} {'regs':>4} {'spill B':>7} {'loads':>9} {'static':>6} {'common':>6} "
        f"{'worst':>6} {'budget':>6}       common by pipe: mem/fp/int/other"
    )
    missed = 0
    rows = []
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        match = UPDATE_KERNEL.search(function.split("\n", 1)[0])
        if not match:
            continue
        instrs = parse(function)
        loop = widest_loads_loop(instrs)
        if loop is None:
            continue
        head, tail = loop
        body = [t for a, t in instrs if head <= a <= tail]
        wide = sum(bool(LOAD.search(t)) for t in body)
        loads = sum(bool(ANY_LOAD.search(t)) for t in body)
        elements = UPDATE_UNIT if wide else 1
        rows.append((update_variant(match), elements, wide, loads, len(body), count_loop(instrs, head, elements)))
    rows.sort(key=lambda r: r[0])
    for variant, elements, wide, loads, static, c in rows:
        dtypes = variant.split(" ")
        bytes_read = 2 * UPDATE_BYTES[dtypes[0]] + sum(UPDATE_BYTES[d] for d in dtypes[1:]) if len(dtypes) == 3 else 0
        budget = BUDGET_PER_BYTE * bytes_read if bytes_read else None
        per = c.common / elements
        verdict = "" if budget is None else ("mem" if per <= budget else "issue")
        regs, spilled = registers.get(variant, ("-", 0))
        missed += wide != loads or spilled > 0
        print(
            f"{variant:17} {elements:2} {regs:>4} {spilled:7} {f'{wide}/{loads} 128':>9} {static / elements:6.1f} "
            f"{per:6.1f} {c.worst / elements:6.1f} {budget if budget is not None else '-':>6} {verdict:5} "
            + "/".join(f"{n / elements:.1f}" for n in c.pipes.values())
        )
    if not registers:
        print("no ptxas log given (--ptxas-log, or no OBJECT): spills not checked")
    return 1 if check and missed else 0


def default_cuobjdump() -> str:
    try:
        import triton

        path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        if path.exists():
            return str(path)
    except ImportError:
        pass
    return "cuobjdump"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "object", nargs="?", help="the nvcc output of csrc/tensor_stats/tensor_stats_cuda.cu (or --compile)"
    )
    parser.add_argument("--ptxas-log", help="the -Xptxas -v output of that compile, for registers and spills")
    parser.add_argument("--compile", action="store_true", help="compile the kernels for sm_90 first")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed or a kernel spills")
    parser.add_argument("--cuobjdump", default=default_cuobjdump())
    parser.add_argument("--readiness", action="store_true", help="count format readiness's kernel instead")
    parser.add_argument("--update", action="store_true", help="count update statistics' kernels instead")
    args = parser.parse_args()
    if args.update:
        log = Path(args.ptxas_log).read_text() if args.ptxas_log else None
        return update_main(args.object, log, args.cuobjdump, args.check)
    if args.readiness:
        return readiness_main(args.cuobjdump, args.check)
    log = Path(args.ptxas_log).read_text() if args.ptxas_log else None
    with tempfile.TemporaryDirectory() as folder:
        if args.compile:
            obj, log = compile_object(Path(folder))
        elif args.object:
            obj = Path(args.object)
        else:
            parser.error("give an object file or --compile")
        try:
            done = subprocess.run([args.cuobjdump, "-sass", str(obj)], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError) as error:
            said = getattr(error, "stderr", None) or error
            print(f"error: {args.cuobjdump} -sass {obj} failed: {str(said).strip()}")
            return 2
    registers = spills(log) if log else {}
    rows = []
    for function in re.split(r"\n\s*Function : ", done.stdout)[1:]:
        variant = KERNEL.search(function.split("\n", 1)[0])
        if not variant:
            continue
        mode, formats, dtype = MODES[int(variant.group(1))], int(variant.group(2)), DTYPES[int(variant.group(3))]
        instrs = parse(function)
        head = hot_loop(instrs)
        if head is None:
            continue
        rows.append((dtype, mode, formats, count_loop(instrs, head)))
    order = {name: i for i, name in enumerate(DTYPES + MODES)}
    rows.sort(key=lambda r: (order[r[0]], order[r[1]], r[2]))
    print(
        f"{'dtype':5} {'mode':8} {'F':>1} {'E':>3} {'regs':>4} {'spill B':>7} {'common':>6} {'target':>6} "
        f"{'':4} {'+1 bound':>8} {'worst':>6}  common by pipe: mem/fp/int/other"
    )
    missed = 0
    for dtype, mode, formats, c in rows:
        per = c.common / c.elements
        goal = target(dtype, mode, formats)
        verdict = "" if goal is None else ("PASS" if per <= goal else "FAIL")
        missed += verdict == "FAIL"
        regs, stores, loads = registers.get((mode, formats, dtype), (None, 0, 0))
        one = f"{c.one_bound:+8.1f}" if c.one_bound is not None else f"{'-':>8}"
        print(
            f"{dtype:5} {mode:8} {formats:1} {c.elements:3} {regs if regs is not None else '-':>4} "
            f"{stores + loads:7} {per:6.1f} {goal if goal is not None else '-':>6} {verdict:4} {one} "
            f"{c.worst / c.elements:6.1f}  " + "/".join(f"{n / c.elements:.1f}" for n in c.pipes.values())
        )
    if registers:
        total = sum(stores + loads for _, stores, loads in registers.values())
        print(f"ptxas spill bytes (stores + loads), all {len(registers)} stats kernels: {total}")
        missed += total > 0
    else:
        print("no ptxas log given (--ptxas-log or --compile): spills not checked")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
