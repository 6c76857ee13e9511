#!/usr/bin/env bash
# GPU check, for a machine with a GPU, a CUDA torch already installed and no network:
#   bash bench/gpu_check.sh OUT_DIR
# Installs the prebuilt wheel of `make wheel` (dist/amp_inspect-*.whl, brought along with the working tree)
# into this machine's torch with `pip install --no-deps` and puts its compiled libraries beside the tree's
# Python (the tests and benchmarks run from the tree); only without a wheel does it compile, for the local GPU
# only. Then the stages of the plan below, most important first: the build's info, the CUDA tests and the
# distributed CUDA test (gloo carrying CUDA tensors: NCCL needs one GPU per rank); the timings, each method's
# whole-call and kernel-only times against torch._foreach_norm and GradScaler's non-finite check on the same
# tensors (tensor_stats, format readiness and update statistics; fp32, bf16 and fp16 sets; a 1B-element set);
# compute-sanitizer (memcheck, racecheck, synccheck) on small calls of every kernel variant; bench_step. The
# sanitizers run with torch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1): an access past a tensor's
# end then leaves its own allocation instead of landing, unseen, in a neighbouring cached block.
# What comes back: OUT_DIR holds two files, summary.json (the plan, every stage's status, seconds and cap, the
# machine, the timings and ratios, the launches per call) and gpu_check-HHMMSS.tar.gz (every log, JSON and table
# of the run, summary.json too): a device that brings back at most 8 files brings back everything.
#
# Every stage gets at most its cap and what is left of BUDGET_S (default 540 s, for one device command of
# timeout_s=570); with a wheel the caps add up to the budget. ONLY="tests bench" runs just those stages (a second
# run redoing what failed). Dry run: GPU_CHECK_DRY_RUN=1, or no CUDA GPU visible to torch: the plan is printed
# and written to summary.json, and every stage says why it did not run.
# Exit status (bench/gpu_summary.py decides it): 0 every stage ran and passed; 1 a stage failed or ran out
# of its cap; 3 nothing measured (no stage past the install ran); 4 none failed but some did not run.
set -uo pipefail
final="${1:?usage: bash bench/gpu_check.sh OUT_DIR}"
mkdir -p "$final"
final="$(cd "$final" && pwd)"
# The stages write into a folder of their own, packed into one tarball at the end (the header says why).
run_name="gpu_check-$(date +%H%M%S)"
out="$final/$run_name"
mkdir -p "$out"
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
budget="${BUDGET_S:-540}"
only="${ONLY:-}"
export PYTHONUNBUFFERED=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"

wheel="$(ls "${WHEEL_DIR:-dist}"/amp_inspect-*.whl 2>/dev/null | tail -n 1)"  # WHEEL_DIR: where else to look
# The plan, in the order the stages run: name|cap in seconds|kind|torch's caching allocator|what it runs.
# The install is a pip install with a wheel, a build without. Timing stages time every method's whole call
# (host clock, synchronized) and its kernels alone (the profiler's kernel durations).
install_cap=30
[ -n "$wheel" ] || install_cap=240
plan=(
  "install|$install_cap|build|on|the wheel into this torch (pip install --no-deps), or a build for this GPU without one"
  "info|15|check|on|python -m amp_inspect.info: the kernels and images built, the GPU covered"
  "tests|130|check|on|every cuda-marked test, and tests/test_info.py"
  "dist|20|check|on|the distributed CUDA test (2 gloo ranks on GPU 0)"
  "bench|80|timing|on|tensor_stats: whole-call and kernel-only times against foreach_norm and GradScaler's check; gpt2-style, 300x75M in fp32, bf16, fp16; launches per call"
  "readiness|40|timing|on|format readiness, all recipes and one: whole-call and kernel-only times against foreach_norm and GradScaler's check; fp32, bf16, fp16 sets"
  "update|35|timing|on|update statistics: whole-call and kernel-only times against foreach_norm, GradScaler's check and AdamW's step; fp32, bf16, fp16 weights"
  "big|45|timing|on|the 1B-element set (memory allowing): tensor_stats, readiness and update statistics, whole-call and kernel-only times"
  "memcheck|35|sanitizer|off|compute-sanitizer --tool memcheck on small calls of every kernel variant"
  "racecheck|50|sanitizer|off|compute-sanitizer --tool racecheck on small calls of every kernel variant"
  "synccheck|25|sanitizer|off|compute-sanitizer --tool synccheck on small calls of every kernel variant"
  "bench_step|35|timing|on|training steps with and without the inspector"
)
declare -A cap_of_stage allocator_of_stage
{ printf 'budget\t%s\nwheel\t%s\n' "$budget" "${wheel:-none}"
  for entry in "${plan[@]}"; do
    IFS='|' read -r name cap kind allocator what <<< "$entry"
    cap_of_stage[$name]=$cap
    allocator_of_stage[$name]=$allocator
    printf 'stage\t%s\t%s\t%s\t%s\t%s\n' "$name" "$cap" "$kind" "$allocator" "$what"
  done; } > "$out/plan.tsv"
echo "plan (budget ${budget}s; stage, cap, kind, caching allocator, what):"
sed -n 's/^stage\t//p' "$out/plan.tsv" | tr '\t' ' ' | sed 's/^/  /'
: > "$out/stages.tsv"

# Why nothing can be measured here, or empty. Asks torch once (this initialises CUDA).
if [ -n "${GPU_CHECK_DRY_RUN:-}" ]; then
  cannot="GPU_CHECK_DRY_RUN=$GPU_CHECK_DRY_RUN: the plan only, nothing run"
else
  cannot="$("$py" - 2>&1 <<'EOF'
import torch
if not torch.cuda.is_available():
    build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
    print(f"no CUDA GPU visible to torch {torch.__version__} ({build}): nothing to measure")
EOF
)" || cannot="$py cannot run torch: $(echo "$cannot" | tail -n 1)"
fi
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  "$py" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)' 2>&1; } > "$out/machine.txt"

cap_of() { echo "${cap_of_stage[$1]}"; }
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$(cap_of "$1")" "$5" >> "$out/stages.tsv"; }

stage() {  # stage NAME REASON_IT_CANNOT_RUN_OR_EMPTY COMMAND...: runs with min(cap, budget left), logs OUT/NAME.log
  local name="$1" why="$2"
  shift 2
  if [ -n "$only" ] && [ "$name" != install ] && [[ " $only " != *" $name "* ]]; then
    why="left out by ONLY=\"$only\""
  fi
  if [ -n "$why" ]; then
    echo "=== $name: cannot run: $why"
    record "$name" not-run "" 0 "$why"
    return
  fi
  local cap left limit
  cap="$(cap_of "$name")"
  left=$((budget - SECONDS))
  limit=$((cap < left ? cap : left))
  if [ "$limit" -le 5 ]; then
    echo "=== $name: skipped, the budget is spent"
    record "$name" skipped "" 0 "budget of ${budget}s spent"
    return
  fi
  # The plan's caching allocator "off": every allocation its own (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so an access
  # past a tensor's end leaves its allocation and is seen.
  local allocator=()
  [ "${allocator_of_stage[$name]}" = off ] && allocator=(env PYTORCH_NO_CUDA_MEMORY_CACHING=1)
  echo "=== $name (limit ${limit}s): ${allocator[*]+${allocator[*]} }$*"
  local start=$SECONDS rc status
  timeout -k 10 "$limit" ${allocator[@]+"${allocator[@]}"} "$@" > "$out/$name.log" 2>&1
  rc=$?
  tail -n 15 "$out/$name.log"
  case $rc in 0) status=passed ;; 124 | 137) status=timeout ;; *) status=failed ;; esac
  echo "=== $name: $status (exit $rc) after $((SECONDS - start))s"
  record "$name" "$status" "$rc" "$((SECONDS - start))" ""
}

install_wheel() {  # pip install --no-deps, then the wheel's libraries beside the tree's Python
  local site
  if ! "$py" -m pip install --no-deps --no-index --force-reinstall "$wheel"; then
    echo "pip could not install the wheel here; taking its libraries out of it instead"
    "$py" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); [z.extract(n, ".") for n in z.namelist() if n.startswith("amp_inspect/_C") and n.endswith(".so")]' "$wheel" || return 1
    return 0
  fi
  site="$(cd / && env -u PYTHONPATH "$py" -c 'import amp_inspect, os; print(os.path.dirname(amp_inspect.__file__))')" || return 1
  cp "$site"/_C*.so amp_inspect/ || return 1
  if diff -rq --exclude=__pycache__ --exclude='*.so' "$site" amp_inspect > /dev/null; then
    echo "the wheel's Python equals the working tree's"
  else
    echo "WARNING: the wheel's Python differs from the working tree's (make wheel again): the tree's runs"
  fi
}

build_here() {  # no wheel: compile in place for this GPU only (much faster than every architecture)
  TORCH_CUDA_ARCH_LIST="$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')" \
    MAX_JOBS="${MAX_JOBS:-16}" "$py" setup.py build_ext --inplace
}

sanitizer="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
no_sanitizer=""
[ -x "$sanitizer" ] || no_sanitizer="compute-sanitizer not found (PATH, $CUDA_HOME/bin)"
no_pytest=""
"$py" -c 'import pytest' 2> /dev/null || no_pytest="pytest is not installed for $py"

if [ -n "$wheel" ]; then
  stage install "$cannot" install_wheel
else
  stage install "$cannot" build_here
fi
built="$cannot"
if [ -z "$built" ] && ! ls amp_inspect/_C*.so > /dev/null 2>&1; then
  built="the install stage left no compiled library in amp_inspect/"
fi
# Every test file with tests marked cuda (tests/test_gpu_check.py keeps this list true), but test_distributed.py,
# which the dist stage runs.
cuda_tests="tests/test_cuda.py tests/test_inspector_cuda.py tests/test_fallback.py tests/test_activations.py \
  tests/test_hardware.py tests/test_integrations.py tests/test_readiness_cuda.py tests/test_update_stats_cuda.py \
  tests/test_inspector.py tests/test_scaler.py"
stage info "$built" "$py" -m amp_inspect.info
stage tests "${built:-$no_pytest}" bash -c "'$py' -m pytest -q -p no:cacheprovider -m cuda $cuda_tests \
  && '$py' -m pytest -q -p no:cacheprovider tests/test_info.py"
stage dist "${built:-$no_pytest}" "$py" -m pytest -q -p no:cacheprovider -m cuda tests/test_distributed.py
stage bench "$built" "$py" bench/bench_tensor_stats.py --device cuda --out "$out"
stage readiness "$built" "$py" bench/bench_readiness.py --device cuda --out "$out"
stage update "$built" bash -c "for weights in float32 bfloat16 float16; do \
  '$py' bench/bench_update_kernel.py --device cuda --weights \$weights --out '$out' || exit 1; done"
stage big "$built" bash -c "'$py' bench/bench_tensor_stats.py --device cuda --set 1B --dtype float32 \
  --dtype bfloat16 --dtype float16 --methods fused_fp16,fused_4formats,gradscaler_check --tag 1B --out '$out' \
  && '$py' bench/bench_readiness.py --device cuda --big --rounds 5 --out '$out' \
  && '$py' bench/bench_update_kernel.py --device cuda --big --rounds 5 --out '$out'"
stage memcheck "${built:-$no_sanitizer}" "$sanitizer" --tool memcheck --error-exitcode 1 \
  "$py" bench/sanitize_small.py
stage racecheck "${built:-$no_sanitizer}" "$sanitizer" --tool racecheck --error-exitcode 1 \
  "$py" bench/sanitize_small.py
stage synccheck "${built:-$no_sanitizer}" "$sanitizer" --tool synccheck --error-exitcode 1 \
  "$py" bench/sanitize_small.py
stage bench_step "$built" "$py" bench/bench_step.py --device cuda --out "$out"
"$py" bench/gpu_summary.py "$out"
status=$?
# Two files in OUT_DIR: the summary, and everything in one tarball (the stage folder goes once it is packed).
cp "$out/summary.json" "$final/summary.json"
if tar -czf "$final/$run_name.tar.gz" -C "$final" "$run_name"; then
  rm -rf "$out"
  echo "everything: $final/$run_name.tar.gz; the summary: $final/summary.json"
fi
exit "$status"
