#!/usr/bin/env bash
# GPU check: on a machine with a GPU and a CUDA torch already installed, and no network, build the extension
# in place, run the CUDA tests and the CUDA benchmark, and write logs and JSON to the folder given as $1.
# Budgeted to finish in under 8 minutes; each stage has its own timeout so one stuck stage cannot eat the rest.
#   bash bench/gpu_check.sh OUT_DIR
set -uo pipefail
out="${1:?usage: bench/gpu_check.sh OUT_DIR}"
mkdir -p "$out"
cd "$(dirname "$0")/.."
py="${PYTHON:-python}"
export PYTHONUNBUFFERED=1
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
# Build only for the GPU in this machine: faster than the default list.
if [ -z "${TORCH_CUDA_ARCH_LIST:-}" ]; then
  TORCH_CUDA_ARCH_LIST="$("$py" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')"
  export TORCH_CUDA_ARCH_LIST
fi
export MAX_JOBS="${MAX_JOBS:-8}"

stage() {  # stage NAME SECONDS COMMAND...: run with a timeout, log to $out/NAME.log, record the exit code
  local name="$1" limit="$2"
  shift 2
  echo "=== $name (limit ${limit}s): $*"
  local start=$SECONDS
  timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start))s" | tee -a "$out/summary.txt"
}

{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; "$py" -c 'import torch; print(torch.__version__, torch.version.cuda)'; } > "$out/machine.txt" 2>&1
stage build 240 "$py" -m pip install --no-build-isolation --no-deps -e .
stage info 30 "$py" -m amp_inspect.info
stage tests 150 "$py" -m pytest -q -p no:cacheprovider tests/test_cuda.py tests/test_op.py tests/test_unscale.py \
  tests/test_inspector_cuda.py tests/test_hardware.py
stage dist 90 "$py" -m pytest -q -p no:cacheprovider tests/test_distributed.py -m cuda
stage bench 120 "$py" bench/bench_tensor_stats.py --device cuda --out "$out"
stage bench_step 90 "$py" bench/bench_step.py --device cuda --out "$out"
cat "$out/summary.txt"
