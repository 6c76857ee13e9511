#!/usr/bin/env bash
# GPU check: on a machine with a GPU and a CUDA torch already installed, and no network, build the extension
# in place for the local GPU only, run the CUDA tests, compute-sanitizer on one small call of every kernel
# variant, and the CUDA benchmarks; write logs, JSON and one summary.json (pass/fail per stage, the benchmark
# ratios, launches per call) to the folder given as $1.
# Fits in one 8-minute device command including the build: every stage gets at most what is left of the
# budget (BUDGET_S, default 450 s), most important first.
#   bash bench/gpu_check.sh OUT_DIR
set -uo pipefail
out="${1:?usage: bench/gpu_check.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"
budget="${BUDGET_S:-450}"
export PYTHONUNBUFFERED=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
# Build only for the GPU in this machine: much faster than the default list of six architectures.
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST="$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
  export TORCH_CUDA_ARCH_LIST
fi
export MAX_JOBS="${MAX_JOBS:-16}"
sanitizer="$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")"
: > "$out/stages.tsv"

stage() {  # stage NAME CAP_SECONDS COMMAND...: run with min(cap, budget left), log to $out/NAME.log
  local name="$1" cap="$2"
  shift 2
  local left=$((budget - SECONDS))
  local limit=$((cap < left ? cap : left))
  if [ "$limit" -le 5 ]; then
    echo "=== $name: skipped, budget spent"
    printf '%s\t%s\t%s\n' "$name" "skipped" 0 >> "$out/stages.tsv"
    return
  fi
  echo "=== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  tail -n 15 "$out/$name.log"
  echo "=== $name: exit $rc after $((SECONDS - start))s"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$out/stages.tsv"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; "$py" -c 'import torch; print(torch.__version__, torch.version.cuda)'; } > "$out/machine.txt" 2>&1
stage build 200 "$py" -m pip install --no-build-isolation --no-deps -e .
stage info 30 "$py" -m amp_inspect.info
stage tests 120 "$py" -m pytest -q -x -p no:cacheprovider -m "cuda or cuda_emu or not slow" tests/test_cuda.py \
  tests/test_unscale.py tests/test_inspector_cuda.py tests/test_info.py
stage memcheck 40 "$sanitizer" --tool memcheck --error-exitcode 1 "$py" bench/sanitize_small.py
stage racecheck 60 "$sanitizer" --tool racecheck --error-exitcode 1 "$py" bench/sanitize_small.py
stage synccheck 40 "$sanitizer" --tool synccheck --error-exitcode 1 "$py" bench/sanitize_small.py
stage bench 90 "$py" bench/bench_tensor_stats.py --device cuda --out "$out"
stage bench_step 60 "$py" bench/bench_step.py --device cuda --out "$out"
stage dist 40 "$py" -m pytest -q -p no:cacheprovider tests/test_distributed.py -m cuda
"$py" bench/gpu_summary.py "$out" || true
