# The documented commands: `make demo`, `make test` (each sets up .venv first when it is missing),
# `make setup` (set-up alone), `make bench`, `make lint`, `make test-emu-tsan` (the CUDA kernels' source
# under ThreadSanitizer on the CPU; needs only g++), `make test-oldest-torch` (built from source against torch
# 2.10, the oldest supported, in a venv of its own, and the smoke suite run there).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Re-run the set-up when the build inputs change (it rebuilds the extension).
STAMP := $(VENV)/.amp_inspect-setup
BUILD_INPUTS := setup.py pyproject.toml $(shell find csrc -type f)

.PHONY: setup demo test wheel test-wheel test-oldest-torch test-no-toolkit test-emu-tsan lint bench gpu-check clean

# Whether setup.py built the CPU kernels only because no GPU is visible (exit 0), and the line that says so.
CPU_ONLY_BUILD := import os, sys, torch; sys.exit(torch.version.cuda is None or torch.cuda.is_available() or \
	bool(os.environ.get('TORCH_CUDA_ARCH_LIST')))
CPU_ONLY_LINE := amp_inspect: no GPU here, so the CPU kernels only; to build the CUDA kernels anyway: \
	TORCH_CUDA_ARCH_LIST=9.0 $(BIN)/pip install --no-build-isolation -e . (your GPU's arch; make wheel: every arch)

setup: $(STAMP)

$(STAMP): $(BUILD_INPUTS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check torch numpy ninja "setuptools>=77" wheel
	$(BIN)/pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test,all]"
	$(BIN)/python -m amp_inspect.info
	@# No GPU and no TORCH_CUDA_ARCH_LIST: setup.py built the CPU kernels only (pip --quiet hides its line).
	@$(BIN)/python -c "$(CPU_ONLY_BUILD)" && echo "$(CPU_ONLY_LINE)" || true
	touch $(STAMP)

demo: setup
	$(BIN)/amp-inspect demo

lint: setup
	$(BIN)/ruff check amp_inspect tests bench examples docs/regenerate_demo_figures.py setup.py
	$(BIN)/ruff format --check amp_inspect tests bench examples docs/regenerate_demo_figures.py setup.py

test: setup lint
	$(BIN)/python -m pytest -q

# dist/amp_inspect-<version>-cp310-abi3-<platform>.whl, one file for every torch from 2.10 on and CPython 3.10
# on: CPU kernels and, for the CUDA major of the torch in .venv, CUDA kernels for WHEEL_ARCHS (sm_80 to
# sm_120, PTX of the newest). Built from a fresh build folder, so no object of an in-place build leaks in; the
# tests' amp_inspect._C_emu, which `setup` builds in place, is left out (setup.py: a wheel holds what users call).
WHEEL_ARCHS ?= 8.0;8.6;8.9;9.0;10.0;12.0+PTX
wheel: setup
	rm -rf build/wheel dist/amp_inspect-*.whl
	TORCH_CUDA_ARCH_LIST="$(WHEEL_ARCHS)" $(BIN)/python setup.py --quiet build --build-base build/wheel \
		bdist_wheel --dist-dir dist
	ls -l dist/amp_inspect-*.whl

# The wheel installed with --no-deps beside torch 2.10 (another torch, another CUDA major): smoke suite + info.
test-wheel:
	PYTHON=$(PYTHON) bash .ci/oldest_torch.sh --wheel

# Set-up without a system CUDA toolkit: a copy of the tree built against .venv's torch with /usr/local/cuda,
# CUDA_HOME and nvcc on PATH hidden (AMP_INSPECT_IGNORE_SYSTEM_CUDA=1), so setup.py installs NVIDIA's nvcc for
# torch's CUDA from PyPI into .venv and builds the CUDA kernels (one arch) with it; checks they are in.
test-no-toolkit: setup
	OLDEST_VENV=$(CURDIR)/$(VENV) OLDEST_CUDA=1 \
		TORCH_OLDEST=$$($(BIN)/python -c "import torch; print(torch.__version__.split('+')[0])") \
		bash .ci/oldest_torch.sh

# A venv of its own under build/ (torch 2.10.0 and the build tools; about 60 s to install the first time),
# a copy of the working tree built from source against it (CPU kernels), tests/test_smoke.py run there.
test-oldest-torch:
	PYTHON=$(PYTHON) bash .ci/oldest_torch.sh

bench: setup
	$(BIN)/python bench/bench_tensor_stats.py --device cpu
	$(BIN)/python bench/bench_step.py --device cpu
	$(BIN)/python bench/bench_distributed.py

# The CUDA kernels run on the CPU (csrc/common/cuda_emu.h), each CUDA thread a host thread, under ThreadSanitizer:
# a missing barrier is reported as a data race, a wrong index or merge as a mismatch with the serial reference.
# The stats kernels (tsan_driver.cpp), then format readiness's (readiness_tsan_driver.cpp), then update_stats'
# (update_tsan_driver.cpp).
test-emu-tsan:
	mkdir -p build
	g++ -std=c++20 -O1 -g -Wno-unknown-pragmas -fsanitize=thread -pthread -Icsrc tests/emu/tsan_driver.cpp -o build/emu_tsan
	TSAN_OPTIONS="halt_on_error=1" build/emu_tsan
	g++ -std=c++20 -O1 -g -Wno-unknown-pragmas -fsanitize=thread -pthread -Icsrc tests/emu/readiness_tsan_driver.cpp -o build/readiness_emu_tsan
	TSAN_OPTIONS="halt_on_error=1" build/readiness_emu_tsan
	g++ -std=c++20 -O1 -g -Wno-unknown-pragmas -fsanitize=thread -pthread -Icsrc tests/emu/update_tsan_driver.cpp -o build/update_emu_tsan
	TSAN_OPTIONS="halt_on_error=1" build/update_emu_tsan

# On a machine with a GPU and torch already installed (no network): see bench/gpu_check.sh.
gpu-check:
	bash bench/gpu_check.sh bench/results/gpu

clean:
	rm -rf build amp_inspect/_C*.so *.egg-info
