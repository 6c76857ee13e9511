"""Format readiness's CUDA kernels on a real GPU (csrc/readiness/readiness_cuda.cu) against the float64 reference: the
counts and amax exactly, the sums to the emulation tests' tolerance, on the emulation tests' cases at the GPU's
own work chunk (16 warp tasks), with grids from the occupancy API; plus what only a GPU has: the current
stream, no host sync, CUDA graph capture. Marked ``cuda``: skipped, saying so, without a visible GPU
(conftest.py); tests/test_readiness_emu.py runs the same kernel source on the CPU everywhere."""

from __future__ import annotations

import pytest
import torch

import amp_inspect.core._native  # noqa: F401  (loads _C and, beside a CUDA torch of its major, _C_cuda)
from amp_inspect.core.recipes import RECIPES
from amp_inspect.core.references.format_readiness import format_readiness_reference
from tests.test_readiness_emu import DTYPES, ROW_LENGTHS, SUM_RTOL, edge_rows, gaussian, random_bits

pytestmark = pytest.mark.cuda

ALL = tuple(range(len(RECIPES)))


def check_on_gpu(tensors, recipes=ALL, tensor_amax=None):
    on_gpu = [t.cuda() for t in tensors]
    amax_gpu = tensor_amax.cuda() if tensor_amax is not None else None
    counts, sums, amax = torch.ops.amp_inspect.format_readiness(on_gpu, list(recipes), amax_gpu)
    assert counts.is_cuda and sums.is_cuda and amax.is_cuda
    want_counts, want_sums, want_amax = format_readiness_reference(tensors, recipes, tensor_amax)
    assert torch.equal(counts.cpu(), want_counts)
    assert torch.equal(amax.cpu().view(torch.int32), want_amax.view(torch.int32))
    torch.testing.assert_close(sums.cpu(), want_sums, rtol=SUM_RTOL, atol=0.0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_edges_random_bits_and_every_row_length(dtype, rng):
    check_on_gpu([edge_rows(dtype)])
    check_on_gpu([random_bits(rng, (3, n), dtype) for n in ROW_LENGTHS])
    check_on_gpu([gaussian(rng, (40, n), dtype) for n in ROW_LENGTHS], ALL, torch.ones(len(ROW_LENGTHS)))


def test_large_tensors_many_blocks_and_many_tensors(rng):
    """Tensors of millions of elements (many chunks per block of a full grid) and 70 tensors (several launches)."""
    check_on_gpu([gaussian(rng, (2048, 1536), torch.bfloat16), gaussian(rng, (1000, 4099), torch.float32)])
    check_on_gpu([random_bits(rng, (i % 7 + 1, 3 * i + 1), DTYPES[i % 3]) for i in range(70)])


def test_captured_in_a_cuda_graph_and_replayed(rng):
    """The views travel in the launches' parameters: a replay measures the tensors' new contents."""
    x = gaussian(rng, (64, 300), torch.float16).cuda()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.ops.amp_inspect.format_readiness([x], list(ALL), None)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counts, sums, amax = torch.ops.amp_inspect.format_readiness([x], list(ALL), None)
    x.copy_(gaussian(rng, (64, 300), torch.float16).cuda() * 1000)
    graph.replay()
    torch.cuda.synchronize()
    want = format_readiness_reference([x.cpu()], ALL)
    assert torch.equal(counts.cpu(), want[0]) and torch.equal(amax.cpu(), want[2])
    torch.testing.assert_close(sums.cpu(), want[1], rtol=SUM_RTOL, atol=0.0)


def test_a_tensor_amax_list_under_graph_capture_is_refused_in_one_sentence(rng):
    """A list of amaxes becomes a pageable host-to-device copy, which a CUDA graph cannot capture: refused before
    anything is launched, saying to pass a CUDA tensor made before the capture."""
    from amp_inspect import format_readiness

    x = gaussian(rng, (64, 256), torch.float16).cuda()
    format_readiness([x], "fp8_e4m3_tensor", tensor_amax=[1.0])  # outside a capture a list is fine
    graph = torch.cuda.CUDAGraph()
    refused = pytest.raises(ValueError, match="tensor_amax given as a list while a CUDA graph is being captured")
    with refused, torch.cuda.graph(graph):
        format_readiness([x], "fp8_e4m3_tensor", tensor_amax=[1.0])


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_the_capture_refusal_looks_at_the_tensors_gpu_not_the_current_one(rng):
    """Capturing on cuda:1 while the current device is cuda:0: the list would be copied on cuda:1's capturing stream,
    so it is refused there too (the check asks the tensors' GPU, not the current device)."""
    from amp_inspect import format_readiness

    x = gaussian(rng, (64, 256), torch.float16).to("cuda:1")
    graph = torch.cuda.CUDAGraph()
    refused = pytest.raises(ValueError, match="tensor_amax given as a list while a CUDA graph is being captured")
    with refused, torch.cuda.device(1), torch.cuda.graph(graph), torch.cuda.device(0):
        format_readiness([x], "fp8_e4m3_tensor", tensor_amax=[1.0])
