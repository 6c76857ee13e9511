"""Shared fixtures and skip rules. The GPU is only queried when a test marked ``cuda`` is about to run,
never at import or collection time, so collection works on machines without CUDA."""

from __future__ import annotations

import functools

import pytest
import torch


@functools.cache
def cuda_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("cuda") is not None and not cuda_available():
        pytest.skip("needs a visible CUDA GPU (torch.cuda.is_available() is False)")


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
