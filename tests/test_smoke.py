"""The smoke suite: what must hold on every supported torch (2.10 to 2.15) for a build from source and for the
wheel installed beside another torch. Self-contained (imports only amp_inspect, torch and pytest), so
scripts/test_oldest_torch.sh runs it from a folder of its own against an installed amp_inspect.

Marked ``smoke``: ``pytest -m smoke`` runs these alone; the default run includes them."""

from __future__ import annotations

import math

import pytest
import torch

import amp_inspect
from amp_inspect.core import ops as _ops
from amp_inspect.core.references.tensor_stats import tensor_stats_reference

pytestmark = pytest.mark.smoke

FORMATS = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
FORMAT_DTYPES = {
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


def _neighbours(value: float) -> list[float]:
    """value and its float32 neighbours on both sides, both signs."""
    x = torch.tensor(value, dtype=torch.float32)
    up = torch.nextafter(x, torch.tensor(math.inf)).item()
    down = torch.nextafter(x, torch.tensor(0.0)).item()
    return [v for u in (value, up, down) for v in (u, -u)]


def boundary_values() -> list[float]:
    """Every format's max finite, smallest normal and smallest subnormal, the points halfway to the next
    representable value (where rounding changes category), each with its float32 neighbours, and the specials."""
    values = [0.0, -0.0, math.inf, -math.inf, math.nan, 1.0, 1e-45, 3.4028234663852886e38]
    for dtype in FORMAT_DTYPES.values():
        info = torch.finfo(dtype)
        mantissa = {torch.float16: 10, torch.bfloat16: 7, torch.float8_e4m3fn: 3, torch.float8_e5m2: 2}[dtype]
        smallest_subnormal = info.tiny * 2.0**-mantissa
        for v in (info.max, info.max * (1 + 2.0 ** -(mantissa + 1)), info.tiny, smallest_subnormal):
            values += _neighbours(v)
        values += _neighbours(smallest_subnormal / 2)  # the zero threshold
    return values


def assert_same(got, want, sumsq_rtol: float = 0.0) -> None:
    """Equal outputs; sumsq within sumsq_rtol where the two sides add in different orders."""
    names = ("counts", "hist", "amax", "amin_nonzero", "sumsq")
    for name, g, w in zip(names, got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        if name == "sumsq" and sumsq_rtol:
            torch.testing.assert_close(g, w, rtol=sumsq_rtol, atol=0.0)
        else:
            assert torch.equal(g, w), f"{name} differs:\n{g}\n{w}"


def test_extension_loaded_with_cpu_kernel():
    assert _ops.extension_loaded(), _ops.LOAD_ERROR
    assert _ops.has_kernel("cpu")
    assert _ops.build_info()["cpu"] == "1"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_op_equals_reference_on_boundary_values(dtype):
    """Each boundary value in a tensor of its own, so every count is judged value by value."""
    tensors = [torch.tensor([v], dtype=dtype) for v in boundary_values()]
    for scale_value in (None, 2.0**-8):
        got = torch.ops.amp_inspect.tensor_stats(tensors, None, scale_value, FORMATS)
        assert_same(got, tensor_stats_reference(tensors, None, scale_value, FORMATS))


def _mixed_tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    boundary = torch.tensor(boundary_values())
    return [
        torch.randn(5000, generator=g) * 300,
        boundary,
        torch.randn(700, generator=g).half(),
        torch.randn(33, 17, generator=g).bfloat16().t(),
        torch.randn(100, dtype=torch.float64, generator=g) * 1e-6,
        torch.empty(0),
    ]


def _emulated_ops() -> bool:
    """Loads the test-only library of the emulated CUDA ops (amp_inspect._C_emu): built in place, never in a wheel."""
    try:
        import amp_inspect._C_emu  # noqa: F401
    except ImportError:
        return False
    return True


needs_emulated_ops = pytest.mark.skipif(
    not _emulated_ops(), reason="amp_inspect._C_emu (test-only, never in a wheel) is not built here"
)


@needs_emulated_ops
@pytest.mark.parametrize("inline_views", [True, False])
def test_emulated_cuda_kernel_equals_cpu_op(inline_views):
    tensors = _mixed_tensors()
    want = torch.ops.amp_inspect.tensor_stats(tensors, None, 4.0, FORMATS)
    got = torch.ops.amp_inspect._tensor_stats_emulated(tensors, None, 4.0, FORMATS, 256, 3, inline_views)
    assert_same(got, want, sumsq_rtol=2e-6)  # as tests/test_cuda_emu.py: the kernels add in another order


@needs_emulated_ops
def test_emulated_unscale_equals_cpu_unscale():
    tensors = [t for t in _mixed_tensors() if t.numel() and t.is_contiguous()]
    emulated = [t.clone() for t in tensors]
    inv_scale, found_cpu, found_emu = torch.tensor(0.25), torch.zeros(1), torch.zeros(1)
    want = torch.ops.amp_inspect.unscale_stats_(tensors, inv_scale, found_cpu, FORMATS)
    got = torch.ops.amp_inspect._unscale_stats_emulated_(emulated, inv_scale, found_emu, FORMATS, 256, 3, False)
    assert_same(got, want, sumsq_rtol=2e-6)
    assert torch.equal(found_cpu, found_emu) and float(found_cpu) == 1.0  # the boundary tensor holds NaN/Inf
    for a, b in zip(tensors, emulated, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_readme_loop():
    """The README's loop on the CPU: attach, check after backward and before scaler.step, summary."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    insp = amp_inspect.attach(model, scaler)
    reports = []
    for _ in range(3):
        batch = torch.randn(4, 8)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(batch).float().pow(2).mean()
        scaler.scale(loss).backward()
        reports.append(insp.check())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert [r.skipped for r in reports] == [False, False, False]
    assert all(math.isfinite(r.total_norm) and r.total_norm > 0 for r in reports)
    summary = insp.summary()
    assert (summary.steps, summary.skipped) == (3, 0)
    assert str(summary).startswith("3 inspected steps, 0 skipped")
    insp.detach()
