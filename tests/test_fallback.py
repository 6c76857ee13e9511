"""The pure-torch fallback (amp_inspect/core/references/tensor_stats.py) as a GPU without the compiled CUDA kernels gets
it (issue 17, D): exactly the compiled op's outputs, no host sync, and torch ops per call that do not grow with the
number of tensors, counted with torch.profiler on the CPU; and (issue 17, C) the warning at the first call,
the `python -m amp_inspect.info` lines and the doctor's finding that say so, with the fix.

The fallback is forced here by hiding the compiled kernels from amp_inspect.core.ops (``KERNELS``), which is what a
binary built without them looks like to the Python layer."""

from __future__ import annotations

import itertools
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

import amp_inspect
from amp_inspect import info
from amp_inspect.core import ops as _ops
from amp_inspect.core.formats import FORMATS
from amp_inspect.core.references import tensor_stats as reference
from amp_inspect.diagnosis import environment_checks
from tests import oracles
from tests import test_boundaries as boundaries_suite

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from models import gpt2_style_shapes  # noqa: E402

# A host sync, or an op whose output size depends on the data (which makes a GPU wait for the host to learn
# it): none may run, at any depth of the call.
SYNCING_OPS = frozenset(
    {
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "aten::equal",
        "aten::nonzero",
        "aten::nonzero_numpy",
        "aten::argwhere",
        "aten::masked_select",
        "aten::unique",
        "aten::_unique",
        "aten::_unique2",
        "aten::unique_dim",
        "aten::unique_consecutive",
        "aten::bincount",
    }
)
MAX_OPS_PER_CALL = 60  # issue 17's target, for any number of tensors
FORMAT_SETS = [combo for r in range(1, 5) for combo in itertools.combinations(FORMATS, r)]
VARIANTS = ("plain", "scale_value", "scale_tensor", "unscale")


def profile(fn) -> tuple[list[str], list[str]]:
    """(the call's top-level torch ops, the syncing ops at any depth) of one call of ``fn``."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.events()
    return [e.name for e in events if e.cpu_parent is None], [e.name for e in events if e.name in SYNCING_OPS]


@pytest.fixture
def fallback(monkeypatch):
    """The compiled kernels hidden: every call takes the pure-torch fallback (its one warning silenced)."""
    monkeypatch.setitem(_ops.OP_KERNELS, "tensor_stats", frozenset())
    monkeypatch.setattr(_ops, "_warned", {"tensor_stats:cpu"})


def gradients(shapes, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) * 10.0 ** (torch.rand((), generator=g).item() * 8 - 8) for s in shapes]


def gpt2_small() -> list[torch.Tensor]:
    """The 76 tensors of the GPT-2-style set (bench/models.py), at small widths: the op count does not
    depend on sizes within one chunk, and the profiler runs many calls."""
    return gradients(gpt2_style_shapes(d_model=16, vocab=64, context=8))


def three_hundred() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    sizes = (10.0 ** (torch.rand(300, generator=g) * 4)).long().tolist()
    return gradients([(s,) for s in sizes], seed=1)


def call(variant: str, tensors: list[torch.Tensor], formats) -> tuple[torch.Tensor, ...]:
    """One op-level call (amp_inspect.core.ops, what the public API and the scaler call) of a variant."""
    formats = list(formats)
    if variant == "plain":
        return _ops.tensor_stats_op(tensors, None, None, formats)
    if variant == "scale_value":
        return _ops.tensor_stats_op(tensors, None, 1024.0, formats)
    if variant == "scale_tensor":
        return _ops.tensor_stats_op(tensors, torch.tensor(2.0**-3), None, formats)
    return _ops.unscale_stats_op(tensors, torch.tensor(1.0), torch.zeros(1), formats)


# ---------------------------------------------------------------------------------------------------------
# D: ops and syncs per call


@pytest.mark.parametrize("variant", VARIANTS)
def test_ops_and_syncs_per_call_do_not_grow_with_the_tensor_count(fallback, variant):
    """Every format combination, 76 and 300 tensors: at most 60 top-level torch ops and no sync per call,
    the first call (which uploads the constants and the layout) included; the same count for both sets."""
    sets = {"76": gpt2_small(), "300": three_hundred()}
    for formats in FORMAT_SETS:
        steady = {}
        for name, tensors in sets.items():
            reference.clear_device_copies()
            first_ops, first_syncs = profile(lambda t=tensors, f=formats: call(variant, t, f))
            ops, syncs = profile(lambda t=tensors, f=formats: call(variant, t, f))
            where = f"{variant}, {name} tensors, {formats}"
            assert first_syncs == [] and syncs == [], where
            assert len(first_ops) <= MAX_OPS_PER_CALL, (where, first_ops)
            assert len(ops) <= MAX_OPS_PER_CALL, (where, ops)
            steady[name] = ops
        assert steady["76"] == steady["300"], (variant, formats)


def test_the_gpt2_sized_set_is_one_chunk_of_at_most_60_ops(fallback):
    """The real GPT-2-sized set (76 tensors, 13.8M elements): one chunk, the same ops as the small set."""
    tensors = gradients(gpt2_style_shapes(context=128))
    assert sum(t.numel() for t in tensors) <= reference.CHUNK_ELEMENTS
    for variant, formats in (("plain", ("fp16",)), ("unscale", FORMATS)):
        call(variant, tensors, formats)
        ops, syncs = profile(lambda v=variant, f=formats: call(v, tensors, f))
        assert syncs == [] and len(ops) <= MAX_OPS_PER_CALL, ops
        small = gpt2_small()
        call(variant, small, formats)
        small_ops, _ = profile(lambda v=variant, f=formats, s=small: call(v, s, f))
        assert ops == small_ops


def test_the_public_call_stays_within_the_target(fallback):
    """amp_inspect.tensor_stats itself (checks and the TensorStats views included), after its first call."""
    tensors = three_hundred()
    amp_inspect.tensor_stats(tensors, formats=FORMATS, scale=4.0)
    ops, syncs = profile(lambda: amp_inspect.tensor_stats(tensors, formats=FORMATS, scale=4.0))
    assert syncs == [] and len(ops) <= MAX_OPS_PER_CALL, ops


def test_ops_grow_by_a_fixed_number_per_chunk_only():
    """Past CHUNK_ELEMENTS a call works in several buffers: each adds the same ops (bounded memory, see
    core/references/tensor_stats.py), and the outputs stay exact across the cut tensors."""
    tensors = gradients([(1000,), (37, 50), (3, 700)])  # 5950 elements
    counts = []
    for chunk in (6000, 3000, 2000):  # 1, 2 and 3 chunks
        reference.tensor_stats_reference(tensors, None, None, ["fp16"], chunk_elements=chunk)
        ops, syncs = profile(
            lambda c=chunk: reference.tensor_stats_reference(tensors, None, None, ["fp16"], chunk_elements=c)
        )
        assert syncs == []
        counts.append(len(ops))
        oracles.assert_outputs_equal(
            reference.tensor_stats_reference(tensors, None, None, ["fp16"], chunk_elements=chunk),
            torch.ops.amp_inspect.tensor_stats(tensors, None, None, ["fp16"]),
        )
    per_chunk = counts[1] - counts[0]
    assert per_chunk > 0
    assert counts[2] - counts[1] <= per_chunk + 2  # at most the views of one more cut tensor


# ---------------------------------------------------------------------------------------------------------
# D: exactly the compiled op's outputs


def awkward_tensors(seed: int) -> list[torch.Tensor]:
    """Every dtype, 0-dim, empty, non-contiguous, expanded and offset views, NaN payloads, +-Inf, +-0,
    subnormals, and values on and near the format boundaries."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31, (3000,), generator=g, dtype=torch.int64).to(torch.int32)
    special = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65504.0, 65520.0, 2.0**-24, 2.0**-25, 464.0, 1e-45]
    )
    wide_bits = torch.randint(-(2**62), 2**62, (500,), generator=g, dtype=torch.int64) * 2
    return [
        bits.view(torch.float32),
        special,
        (torch.randn(40, 30, generator=g) * 1e4).t(),
        torch.randn(7, 9, 5, generator=g).permute(2, 0, 1)[:, 1:, ::2],
        torch.tensor(3.5),
        torch.tensor(float("nan")).half(),
        torch.empty(0),
        torch.empty(3, 0, dtype=torch.float16),
        torch.ones(1).expand(300),
        bits[:1000].to(torch.int16).view(torch.float16),
        bits[1000:2000].to(torch.int16).view(torch.bfloat16).reshape(20, 50).t(),
        wide_bits.view(torch.float64),
        torch.tensor([1e300, -1e-320, 5e-324, 3.4028235677973366e38, 464.00000000001], dtype=torch.float64),
        torch.randn(100, generator=g, dtype=torch.float64)[1::3] * 1e-30,
        torch.tensor(2.0, dtype=torch.float64),
    ]


@pytest.mark.parametrize("chunk", [reference.CHUNK_ELEMENTS, 1000, 7, 1])
@pytest.mark.parametrize("formats", [("fp16",), ("bf16", "fp8_e4m3"), FORMATS])
def test_equals_the_compiled_op(chunk, formats):
    """Chunks of 1 and 7 elements cut every tensor (non-contiguous ones between rows), the stacked 0-dim
    ones included; each scale kind judges float32(x) * float32(scale) as the kernel does."""
    tensors = awkward_tensors(seed=len(formats) + chunk % 97)
    for scale, scale_value in ((None, None), (None, 1024.0), (None, 0.1), (torch.tensor(2.0**-20), None)):
        want = torch.ops.amp_inspect.tensor_stats(tensors, scale, scale_value, list(formats))
        got = reference.tensor_stats_reference(tensors, scale, scale_value, list(formats), chunk_elements=chunk)
        oracles.assert_outputs_equal(got, want, what=f"chunk {chunk}, scale {scale} / {scale_value}: ")


def test_unscale_variant_equals_the_compiled_op(fallback):
    """Statistics as stored, then the same in-place unscale and found_inf as the fused unscale."""
    before = awkward_tensors(seed=5)[:4]
    mine, theirs = [t.clone() for t in before], [t.clone() for t in before]
    found_mine, found_theirs = torch.zeros(1), torch.zeros(1)
    got = _ops.unscale_stats_op(mine, torch.tensor(0.25), found_mine, list(FORMATS))
    want = torch.ops.amp_inspect.unscale_stats_(theirs, torch.tensor(0.25), found_theirs, list(FORMATS))
    oracles.assert_outputs_equal(got, want)
    assert all(oracles.bits_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    assert found_mine.item() == found_theirs.item() == 1.0


def test_no_tensor_and_only_empty_tensors(fallback):
    assert [tuple(t.shape) for t in _ops.tensor_stats_op([], None, None, ["fp16"])] == [
        (0, 8),
        (0, 256),
        (0,),
        (0,),
        (0,),
    ]
    stats = amp_inspect.tensor_stats([torch.empty(0), torch.empty(2, 0).half()], formats=("fp16", "bf16"))
    assert stats.numel.tolist() == [0, 0] and int(stats.hist.sum()) == 0
    assert stats.amax.tolist() == [0.0, 0.0] and stats.amin_nonzero.tolist() == [math.inf, math.inf]


def test_the_callers_tensors_are_not_modified(fallback):
    tensors = awkward_tensors(seed=9)
    copies = [t.clone() for t in tensors]
    amp_inspect.tensor_stats(tensors, formats=FORMATS, scale=3.0)
    amp_inspect.tensor_stats(tensors, formats=FORMATS)
    assert all(oracles.bits_equal(a, b) for a, b in zip(tensors, copies, strict=True))


@pytest.mark.parametrize(
    "case",
    [
        ("test_float32_boundaries", {"formats": FORMATS}),
        ("test_float32_boundaries_in_one_tensor", {}),
        ("test_scaled_boundaries", {"scale": 3.0, "dtype": torch.float64}),
        ("test_scaled_boundaries", {"scale": 2.0**-16, "dtype": torch.float32}),
        ("test_scaled_boundaries_with_tensor_scale", {}),
        ("test_float64_boundaries", {}),
        ("test_all_16_bit_patterns", {"dtype": torch.float16, "scale": None}),
        ("test_all_16_bit_patterns", {"dtype": torch.bfloat16, "scale": 2.0**16}),
        ("test_float32_subnormal_inputs", {}),
    ],
    ids=lambda case: f"{case[0]}-{'-'.join(map(str, case[1].values()))}",
)
def test_the_boundary_suite_through_the_fallback(fallback, case):
    """tests/test_boundaries.py, every value judged by the independent oracles, run on the fallback (one
    tensor per value: up to 65536 tensors in one call)."""
    name, arguments = case
    getattr(boundaries_suite, name)(**arguments)


# ---------------------------------------------------------------------------------------------------------
# C: said loudly, once, with the fix


@pytest.fixture
def cuda_torch_without_cuda_kernels(monkeypatch):
    """A CUDA 13 torch beside a binary built without CUDA kernels."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setitem(_ops.OP_KERNELS, "tensor_stats", frozenset({"cpu"}))
    monkeypatch.setattr(_ops, "build_info", lambda: {"cpu": "1"})


def test_no_cuda_kernels_is_said_with_why_and_the_fix(cuda_torch_without_cuda_kernels):
    message = _ops.no_kernel_warning("cuda")
    assert message.startswith("amp_inspect: NO CUDA KERNELS")
    assert "built without CUDA kernels" in message and "CUDA 13.0" in message
    assert _ops.REBUILD_COMMAND in message and "fallback" in message and "no host sync" in message


def test_a_cuda_major_mismatch_and_a_cuda_12_torch_are_told_apart(monkeypatch, cuda_torch_without_cuda_kernels):
    monkeypatch.setattr(_ops, "build_info", lambda: {"cpu": "1", "cuda": "1", "cuda_major": "13"})
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    assert "built for CUDA 13 and this torch is a CUDA 12 build" in _ops.cuda_kernels_missing()
    assert "cuda-nvcc=12.8" in _ops.cuda_fix() and _ops.REBUILD_COMMAND in _ops.cuda_fix()


def test_a_binary_with_cuda_kernels_or_a_cpu_torch_says_nothing(monkeypatch):
    if not _ops.has_kernel("cuda"):
        pytest.skip("this binary has no CUDA kernels")
    assert _ops.cuda_kernels_missing() is None
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setitem(_ops.OP_KERNELS, "tensor_stats", frozenset({"cpu"}))
    assert _ops.cuda_kernels_missing() is None  # a CPU-only torch has no GPU to serve


def test_info_shows_the_missing_cuda_kernels_and_the_fix(cuda_torch_without_cuda_kernels):
    lines = info.collect()
    assert lines["CUDA kernel"].startswith("NO: the compiled extension was built without CUDA kernels")
    assert _ops.REBUILD_COMMAND in lines["fix"]


def test_info_has_no_fix_line_when_the_cuda_kernels_are_there():
    if not _ops.has_kernel("cuda"):
        pytest.skip("this binary has no CUDA kernels")
    lines = info.collect()
    assert lines["CUDA kernel"] == "yes" and "fix" not in lines


def test_the_doctor_warns_of_missing_cuda_kernels_even_without_a_visible_gpu(cuda_torch_without_cuda_kernels):
    found = {f.code: f for f in environment_checks.extension()}
    finding = found["no-cuda-kernel"]
    assert finding.severity == "warning" and "built without CUDA kernels" in finding.message
    assert _ops.REBUILD_COMMAND in finding.fix


def test_the_doctor_says_nothing_of_cuda_kernels_that_are_there():
    if not _ops.has_kernel("cuda"):
        pytest.skip("this binary has no CUDA kernels")
    assert "no-cuda-kernel" not in {f.code for f in environment_checks.extension()}


def test_the_first_call_without_a_kernel_warns_once(monkeypatch):
    """The CPU stands in for a GPU here (the CUDA test below does it on a GPU): one warning over several
    calls, none after."""
    monkeypatch.setitem(_ops.OP_KERNELS, "tensor_stats", frozenset())
    monkeypatch.setattr(_ops, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            amp_inspect.tensor_stats([torch.ones(3)])
    runtime = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "fallback" in runtime[0] and _ops.REBUILD_COMMAND in runtime[0], runtime


@pytest.mark.cuda
def test_on_a_gpu_the_fallback_equals_the_kernel_syncs_nothing_and_says_so_once(monkeypatch):
    """On a GPU with its CUDA kernels hidden: the first call warns once (NO CUDA KERNELS and the fix), the
    outputs equal the CUDA kernel's, and no call waits for the GPU (no synchronising CUDA runtime call)."""
    tensors = [t.cuda() for t in awkward_tensors(seed=3)]
    want = [torch.ops.amp_inspect.tensor_stats(tensors, None, v, list(FORMATS)) for v in (None, 8.0)]
    monkeypatch.setitem(_ops.OP_KERNELS, "tensor_stats", frozenset({"cpu"}))
    monkeypatch.setattr(_ops, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [_ops.tensor_stats_op(tensors, None, v, list(FORMATS)) for v in (None, 8.0)]
    runtime = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1 and "NO CUDA KERNELS" in runtime[0], runtime
    for g, w in zip(got, want, strict=True):
        oracles.assert_outputs_equal(g, w)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        _ops.tensor_stats_op(tensors, torch.tensor(2.0, device="cuda"), None, list(FORMATS))
        _ops.unscale_stats_op(tensors, torch.tensor(1.0, device="cuda"), torch.zeros(1, device="cuda"), ["fp16"])
    names = [e.name for e in prof.events()]
    waits = [n for n in names if n in SYNCING_OPS or "Synchronize" in n or n == "cudaMemcpy"]
    assert waits == [], waits
