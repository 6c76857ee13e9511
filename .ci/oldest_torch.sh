#!/usr/bin/env bash
# The oldest torch amp_inspect supports (TORCH_OLDEST, 2.10.0), in a venv of its own: amp_inspect built from
# source against it and the smoke suite (tests/test_smoke.py) run there. With WHEEL=dist/amp_inspect-*.whl
# (or `--wheel`: the newest wheel in dist/), that wheel, built against another torch, is also installed with
# --no-deps into the same venv and the smoke suite and `python -m amp_inspect.info` run against it.
# `make test-oldest-torch` runs this; .ci/run runs it after `make test`.
#
# The source build skips the CUDA kernels (AMP_INSPECT_NO_CUDA=1): torch 2.10.0 on PyPI is a CUDA 12.8 build
# and torch refuses a CUDA 13 nvcc for it; the kernels' source is still run through the CPU emulation.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TORCH_OLDEST=${TORCH_OLDEST:-2.10.0}
VENV=${OLDEST_VENV:-$ROOT/build/venv-torch-$TORCH_OLDEST}
WORK=$ROOT/build/oldest-torch
PY=${PYTHON:-python3}
WHEEL=${WHEEL:-}
if [ "${1:-}" = "--wheel" ]; then
  WHEEL=$(ls -t dist/amp_inspect-*.whl 2>/dev/null | head -1)
  [ -n "$WHEEL" ] || { echo "error: no wheel in dist/; run \`make wheel\` first" >&2; exit 2; }
fi

start=$(date +%s)
have=$("$VENV/bin/python" -c "import torch; print(torch.__version__.split('+')[0])" 2>/dev/null || true)
if [ "$have" != "$TORCH_OLDEST" ]; then
  # PIP_CONSTRAINT cleared: a machine-wide constraints file may pin torch to the default version.
  PIP_CONSTRAINT= "$PY" -m venv "$VENV"
  PIP_CONSTRAINT= "$VENV/bin/pip" install --quiet --disable-pip-version-check \
    "torch==$TORCH_OLDEST" numpy ninja "setuptools>=77" wheel pytest
fi
echo "oldest-torch: venv with torch $TORCH_OLDEST ready ($(( $(date +%s) - start )) s)"

# A copy of the working tree (tracked and new files), so the build never touches the default torch's _C.
rm -rf "$WORK" && mkdir -p "$WORK/src"
git ls-files -co --exclude-standard -z | xargs -0 cp --parents -t "$WORK/src"
build_start=$(date +%s)
(cd "$WORK/src" && AMP_INSPECT_NO_CUDA=1 "$VENV/bin/python" setup.py --quiet build_ext --inplace) \
  > "$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; echo "oldest-torch: build failed" >&2; exit 1; }
echo "oldest-torch: built from source against torch $TORCH_OLDEST ($(( $(date +%s) - build_start )) s)"
(cd "$WORK/src" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m smoke tests/test_smoke.py)

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
