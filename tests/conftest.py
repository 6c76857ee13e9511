"""Shared fixtures and skip rules. The GPU is only queried when a test marked ``cuda`` is about to run,
never at import or collection time, so collection works on machines without CUDA; the test-only library of the
emulated CUDA ops, when a test marked ``cuda_emu`` is."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch


@functools.cache
def cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


@functools.cache
def emulated_ops_missing() -> str | None:
    """Why the emulated CUDA ops cannot run (None: loaded): they live in the test-only library
    amp_inspect._C_emu, which in-place and editable builds make and wheels leave out."""
    try:
        importlib.import_module("amp_inspect.core._native")  # _C first: it defines the library the emulated ops join
        importlib.import_module("amp_inspect._C_emu")  # loading it registers the ops
    except ImportError as error:
        return (
            f"needs the test-only library amp_inspect._C_emu, not built here ({error}); `make setup` or "
            "`python setup.py build_ext --inplace` builds it (a wheel never holds it)"
        )
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is not None and not cuda_available():
        pytest.skip("needs a visible CUDA GPU (torch.cuda.is_available() is False)")
    if item.get_closest_marker("cuda_emu") is not None and (missing := emulated_ops_missing()):
        pytest.skip(missing)


@pytest.fixture
def rng():
    """A numpy Generator seeded per test, so failures reproduce."""
    import numpy as np

    return np.random.default_rng(20240611)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: tiny models on a two-core machine that is busy with anything else make every
    step hundreds of times slower with two OpenMP threads (each parallel region waits for a core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
