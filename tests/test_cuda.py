"""The CUDA kernel against the CPU kernel (exactly; sumsq to 2e-6, since the CPU kernel sums squares in
float32 partial sums of 16 terms) and the oracles. Every test here is
marked ``cuda`` and skips (in conftest.py, when it is about to run) without a visible GPU."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

import amp_inspect
from tests import cuda_cases, oracles
from tests.oracles import ALL_FORMATS
from tests.test_large import check_planted, planted_values
from tests.test_random_bits import DTYPES, random_tensor

pytestmark = pytest.mark.cuda

CUDA = torch.device("cuda")


def op(tensors, scale, scale_value, formats=ALL_FORMATS):
    return torch.ops.amp_inspect.tensor_stats(tensors, scale, scale_value, list(formats))


def check_cuda_vs_cpu(tensors_cpu, scale=None, formats=ALL_FORMATS, *, oracle=True):
    """Runs the op on CUDA copies of ``tensors_cpu`` (layouts kept) and on the CPU; compares everything."""
    tensors_cuda = [cuda_like(t) for t in tensors_cpu]
    if isinstance(scale, torch.Tensor):
        scale_cpu, scale_cuda, scale_value, scale_f = scale.cpu(), scale.to(CUDA), None, float(scale)
    else:
        scale_cpu = scale_cuda = None
        scale_value = scale_f = None if scale is None else float(scale)
    got = op(tensors_cuda, scale_cuda, scale_value, formats)
    for out in got:
        assert out.device.type == CUDA.type
    want = op(tensors_cpu, scale_cpu, scale_value, formats)
    oracles.assert_outputs_equal(got, want, rtol=2e-6, what=f"cuda vs cpu (scale {scale}): ")
    stats = amp_inspect.tensor_stats(
        tensors_cuda, scale=scale_cuda if scale_cuda is not None else scale, formats=formats
    )
    assert stats.numel.device.type == CUDA.type
    assert torch.equal(stats.hist.sum(dim=1), stats.numel)
    if oracle:
        oracles.assert_stats_match_oracle(stats, tensors_cpu, scale_f, exact=False)
    return stats


def cuda_like(t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """A copy of ``t`` on ``device`` with the same sizes, strides and storage offset (so the same layout,
    alignment and stride-0 dims): the whole storage is copied and viewed the same way."""
    n = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
    return flat.to(device or CUDA).as_strided(t.shape, t.stride(), t.storage_offset())


@pytest.mark.parametrize(("case", "scale"), cuda_cases.RUNS, ids=cuda_cases.RUN_IDS)
def test_shared_case(case: cuda_cases.Case, scale, rng):
    """The case table tests/test_cuda_emu.py runs too, its sizes on the GPU's chunk edges."""
    tensors = case.tensors(rng, cuda_cases.GPU_CHUNK, big=True)
    stats = check_cuda_vs_cpu(tensors, cuda_cases.scale_of(scale), oracle=case.oracle_at(scale))
    if case.one_nonfinite_each:
        assert (stats.nan + stats.posinf + stats.neginf).tolist() == [1] * len(tensors)


def test_more_than_1000_tensors(rng):
    sizes = rng.integers(0, 3000, 1500)
    tensors = [random_tensor(rng, int(n), DTYPES[i % 4]) for i, n in enumerate(sizes)]
    check_cuda_vs_cpu(tensors, None, oracle=False)
    check_cuda_vs_cpu(tensors, torch.tensor(0.25), oracle=False)


@pytest.mark.parametrize("first", ["cpu", "cuda"])
def test_mixed_cpu_and_cuda_list(first, rng):
    cpu_tensors = [random_tensor(rng, n, DTYPES[i % 4]) for i, n in enumerate((100, 70000, 0, 5, 16385, 9))]
    devices = [first if i % 2 == 0 else ("cuda" if first == "cpu" else "cpu") for i in range(len(cpu_tensors))]
    mixed = [t.to(d) for t, d in zip(cpu_tensors, devices, strict=True)]
    for scale in (None, 3.0, torch.tensor(2.0, device=first)):
        stats = amp_inspect.tensor_stats(mixed, scale=scale, formats=ALL_FORMATS)
        assert stats.numel.device.type == first and stats.hist.device.type == first
        cpu_scale = scale.cpu() if isinstance(scale, torch.Tensor) else scale
        want = amp_inspect.tensor_stats(cpu_tensors, scale=cpu_scale, formats=ALL_FORMATS)
        for name in oracles.EXACT_FIELDS:
            assert torch.equal(getattr(stats, name).cpu(), getattr(want, name)), name
        torch.testing.assert_close(stats.sumsq.cpu(), want.sumsq, rtol=2e-6, atol=0)


def test_no_host_sync(rng):
    tensors = [random_tensor(rng, n, DTYPES[i % 4]).to(CUDA) for i, n in enumerate((10, 70000, 0, 16385))]
    scale = torch.tensor(2.0**-16, device=CUDA)
    amp_inspect.tensor_stats(tensors, scale=3.0)  # warm up: lazy initialisation may sync once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        a = amp_inspect.tensor_stats(tensors, scale=3.0, formats=ALL_FORMATS)
        b = amp_inspect.tensor_stats(tensors, scale=scale, formats=ALL_FORMATS)
        c = amp_inspect.tensor_stats(tensors)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert a.numel.tolist() == b.numel.tolist() == c.numel.tolist() == [10, 70000, 0, 16385]


def _kernel_launches(tensors) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        amp_inspect.tensor_stats(tensors, formats=ALL_FORMATS)
        torch.cuda.synchronize()
    names = [
        e.name
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA
        and "memcpy" not in e.name.lower()
        and "memset" not in e.name.lower()
    ]
    return len(names)


def test_launch_count_independent_of_tensor_count(rng):
    few = [random_tensor(rng, 1000, DTYPES[i % 4]).to(CUDA) for i in range(10)]
    many = [random_tensor(rng, 1000, DTYPES[i % 4]).to(CUDA) for i in range(1000)]
    _kernel_launches(few)  # warm up
    launches_few, launches_many = _kernel_launches(few), _kernel_launches(many)
    assert launches_few > 0
    assert launches_few == launches_many


@pytest.mark.slow
def test_more_than_2_31_elements_cuda():
    free, _ = torch.cuda.mem_get_info()
    if free < 6 * 2**30:
        pytest.skip(f"needs about 5 GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    n = 2**31 + 5
    x = torch.zeros(n, dtype=torch.bfloat16, device=CUDA)
    planted = planted_values(n)
    for i, value in planted.items():
        x[i] = value
    stats = amp_inspect.tensor_stats([x], formats=ALL_FORMATS)
    check_planted(stats, n, planted, torch.bfloat16)
    shifted = amp_inspect.tensor_stats([x[3:]], formats=ALL_FORMATS)  # unaligned start
    assert int(shifted.numel[0]) == n - 3 and int(shifted.nan[0]) == 1


def test_cuda_graph_capture_replays_with_changed_gradients(rng):
    """A captured call (more tensors than fit in one launch's parameters, so the capture-safe path) replayed
    after the gradients changed in place gives the new gradients' statistics."""
    grads = [random_tensor(rng, n, DTYPES[i % 4]).to(CUDA) for i, n in enumerate([100, 70000, 5, 16385] * 6)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm up on a side stream, as torch.cuda.graph requires
        amp_inspect.tensor_stats(grads, scale=2.0, formats=ALL_FORMATS)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op(grads, None, 2.0)
    for _ in range(2):
        fresh = [random_tensor(rng, g.numel(), g.dtype) for g in grads]
        for g, f in zip(grads, fresh, strict=True):
            g.copy_(f.to(CUDA))
        graph.replay()
        torch.cuda.synchronize()
        oracles.assert_outputs_equal(captured, op(fresh, None, 2.0), what="graph replay: ")


def test_inspecting_scaler_unscale_under_graph_capture(rng):
    grads = [torch.randn(n, device=CUDA) * 1e3 for n in (10, 5000, 17) * 7]
    inv = torch.tensor(0.5, device=CUDA)
    found = torch.zeros((), device=CUDA)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.ops.amp_inspect.unscale_stats_([g.clone() for g in grads], inv, found, ["fp16"])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outputs = torch.ops.amp_inspect.unscale_stats_(grads, inv, found, ["fp16"])
    source = [torch.randn(g.numel()) * 1e3 for g in grads]
    source[3][7] = float("inf")
    for g, s in zip(grads, source, strict=True):
        g.copy_(s.to(CUDA))
    found.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert float(found) == 1.0
    expected = [s * 0.5 for s in source]
    for g, e in zip(grads, expected, strict=True):
        assert torch.equal(g.cpu(), e)
    oracles.assert_outputs_equal(outputs, op(source, None, None, ["fp16"]), what="captured unscale: ")


def test_a_call_on_the_legacy_stream_while_another_thread_captures_is_refused_in_one_sentence():
    """A call of more than 16 tensors asks whether its stream is being captured. On the legacy default stream, while
    another thread captures a blocking stream of the device in global mode, CUDA answers that query with
    cudaErrorStreamCaptureImplicit (the legacy stream is unusable until that capture ends): the call is refused in one
    sentence naming the cause, the other capture is left intact (its replay runs), and the next call, after the
    capture, runs (the query's error does not linger)."""
    cudart = ctypes.CDLL(f"libcudart.so.{torch.version.cuda.split('.')[0]}")  # the one torch has loaded
    handle = ctypes.c_void_p()
    assert cudart.cudaStreamCreate(ctypes.byref(handle)) == 0  # blocking: the legacy stream synchronises with it
    blocking = torch.cuda.ExternalStream(handle.value)
    grads = [torch.randn(100, device=CUDA) for _ in range(17)]
    expected = op(grads, None, None)
    op(grads, None, None)  # its outputs, freed, are what the refused call allocates: no cudaMalloc in the capture
    x = torch.ones(8, device=CUDA)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    capturing, refused = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def capture() -> None:  # capture_begin itself: torch.cuda.graph would empty the cache first
        try:
            with torch.cuda.stream(blocking):
                graph.capture_begin(capture_error_mode="global")
                try:
                    x.mul_(2)
                    capturing.set()
                    refused.wait(60)
                finally:
                    graph.capture_end()
        except BaseException as error:  # seen by the test below, not lost in the thread
            errors.append(error)
            capturing.set()

    thread = threading.Thread(target=capture)
    thread.start()
    try:
        assert capturing.wait(60) and not errors, errors
        with pytest.raises(RuntimeError, match=r"legacy default stream while another stream of cuda:\d+ is being ca"):
            op(grads, None, None)
    finally:
        refused.set()
        thread.join(60)
    assert errors == []
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x.cpu(), torch.full((8,), 2.0))
    oracles.assert_outputs_equal(op(grads, None, None), expected, what="after the capture: ")
    cudart.cudaStreamDestroy(handle)


def test_non_default_stream(rng):
    tensors_cpu = [random_tensor(rng, n, DTYPES[i % 4]) for i, n in enumerate((100, 70000, 16385))]
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        tensors = [t.to(CUDA, non_blocking=False) for t in tensors_cpu]
        got = op(tensors, None, 3.0)
    stream.synchronize()
    oracles.assert_outputs_equal(got, op(tensors_cpu, None, 3.0))


def test_second_gpu_when_present(rng):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    tensors_cpu = [random_tensor(rng, n, DTYPES[i % 4]) for i, n in enumerate((100, 70000))]
    got = op([t.to("cuda:1") for t in tensors_cpu], None, None)
    assert got[0].device == torch.device("cuda:1")
    oracles.assert_outputs_equal(got, op(tensors_cpu, None, None))


def test_gpu_the_binary_cannot_serve_falls_back_to_the_reference(rng, monkeypatch):
    from amp_inspect.core import ops as _ops

    index = torch.cuda.current_device()
    monkeypatch.setitem(_ops._device_supported, index, False)
    monkeypatch.setattr(_ops, "_warned", set())
    tensors_cpu = [random_tensor(rng, n, torch.float32) for n in (100, 5000)]
    with pytest.warns(RuntimeWarning, match="no kernel for"):
        stats = amp_inspect.tensor_stats([t.to(CUDA) for t in tensors_cpu], formats=ALL_FORMATS)
    want = amp_inspect.tensor_stats(tensors_cpu, formats=ALL_FORMATS)
    for name in oracles.EXACT_FIELDS:
        assert torch.equal(getattr(stats, name).cpu(), getattr(want, name)), name
