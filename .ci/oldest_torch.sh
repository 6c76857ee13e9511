#!/usr/bin/env bash
# The oldest torch amp_inspect supports (TORCH_OLDEST, 2.10.0), in a venv of its own: amp_inspect built from
# source against it and the smoke suite (tests/test_smoke.py) run there. With WHEEL=dist/amp_inspect-*.whl
# (or `--wheel`: the newest wheel in dist/, and no source build), that wheel, built against another torch, is also installed with
# --no-deps into the same venv and the smoke suite and `python -m amp_inspect.info` run against it.
# `make test-oldest-torch` runs this; .ci/run runs it after `make test`.
#
# Beside a torch of CUDA 13 or later (TORCH_OLDEST=2.11.0: cu130) the source build hides the system CUDA
# toolkit (AMP_INSPECT_IGNORE_SYSTEM_CUDA=1), so setup.py must fetch NVIDIA's nvcc for torch's CUDA from PyPI
# and build the CUDA kernels with it (one arch, OLDEST_CUDA_ARCH, to keep it short); the run checks they are
# in. torch 2.10.0 is a CUDA 12.8 build, for which PyPI has no nvcc: CPU kernels only (OLDEST_CUDA=0, the
# default there; OLDEST_CUDA=1 forces the attempt, =0 skips it).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCH_OLDEST=${TORCH_OLDEST:-2.10.0}
VENV=${OLDEST_VENV:-$ROOT/build/venv-torch-$TORCH_OLDEST}
WORK=$ROOT/build/oldest-torch
PY=${PYTHON:-python3}
WHEEL=${WHEEL:-}
WHEEL_ONLY=
if [ "${1:-}" = "--wheel" ]; then
  WHEEL_ONLY=1
  WHEEL=$(ls -t dist/amp_inspect-*.whl 2>/dev/null | head -1)
  [ -n "$WHEEL" ] || { echo "error: no wheel in dist/; run \`make wheel\` first" >&2; exit 2; }
fi

start=$(date +%s)
have=$("$VENV/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ "$have" != "$TORCH_OLDEST" ]; then
  # No constraints file (PIP_CONSTRAINT=/dev/null; an empty value does not clear one): a machine-wide one may
  # pin torch to the default version.
  "$PY" -m venv "$VENV"
  PIP_CONSTRAINT=/dev/null "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "torch==$TORCH_OLDEST" numpy ninja "setuptools>=77" wheel pytest
fi
echo "oldest-torch: venv with torch $TORCH_OLDEST ready ($(( $(date +%s) - start )) s)"

if [ -z "$WHEEL_ONLY" ]; then
  # A copy of the working tree (tracked and new files), so the build never touches the default torch's _C.
  rm -rf "$WORK" && mkdir -p "$WORK/src"
  git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK/src"
  build_start=$(date +%s)
  cuda_major=$("$VENV/bin/python" -c "import torch; print((torch.version.cuda or '0').split('.')[0])")
  OLDEST_CUDA=${OLDEST_CUDA:-$([ "$cuda_major" -ge 13 ] && echo 1 || echo 0)}
  if [ "$OLDEST_CUDA" = "1" ]; then
    build_env=(AMP_INSPECT_IGNORE_SYSTEM_CUDA=1 "TORCH_CUDA_ARCH_LIST=${OLDEST_CUDA_ARCH:-8.0}" PIP_CONSTRAINT=/dev/null)
  else
    build_env=(AMP_INSPECT_NO_CUDA=1)
  fi
  (cd "$WORK/src" && env "${build_env[@]}" "$VENV/bin/python" setup.py --quiet build_ext --inplace) \
    > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; echo "oldest-torch: build failed" >&2; exit 1; }
  grep "^\*\*\* amp_inspect" "$WORK/build.log" || true
  echo "oldest-torch: built from source against torch $TORCH_OLDEST ($(( $(date +%s) - build_start )) s)"
  if [ "$OLDEST_CUDA" = "1" ]; then
    # No GPU needed: the CUDA library loads (CUDA majors match) and registers the CUDA kernels.
    (cd "$WORK/src" && "$VENV/bin/python" -c "
from amp_inspect.core import ops as _ops
info = _ops.build_info()
assert info['cuda'] == '1' and _ops.has_kernel('cuda'), (info, _ops.CUDA_OFF)
print('oldest-torch: CUDA kernels built with the PyPI nvcc:', info['cuda_archs'], 'for CUDA', info['cuda_major'])")
  fi
  (cd "$WORK/src" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m smoke tests/test_smoke.py)
fi

if [ -n "$WHEEL" ]; then
  # A folder holding nothing but the smoke suite: the installed wheel is what `import amp_inspect` finds.
  mkdir -p "$WORK/wheel-test" && cp tests/test_smoke.py "$WORK/wheel-test/"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps --force-reinstall "$WHEEL"
  (cd "$WORK/wheel-test" && "$VENV/bin/python" -m amp_inspect.info \
    && "$VENV/bin/python" -m pytest -q -p no:cacheprovider --rootdir=. test_smoke.py)
  "$VENV/bin/pip" uninstall --quiet --yes amp_inspect
  echo "oldest-torch: $(basename "$WHEEL") passed beside torch $TORCH_OLDEST"
fi
echo "oldest-torch: done in $(( $(date +%s) - start )) s"
