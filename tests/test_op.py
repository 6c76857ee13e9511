"""The op as torch sees it (opcheck, torch.compile, no_grad), input validation, what was built, and the
pure-torch fallback when the compiled extension cannot load."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import amp_inspect
from amp_inspect.core import ops as _ops
from amp_inspect.core.ops import tensor_stats_op, unscale_stats_op
from amp_inspect.core.references.tensor_stats import tensor_stats_reference
from tests import oracles
from tests.oracles import ALL_FORMATS

REPO = Path(__file__).resolve().parents[1]
OP = torch.ops.amp_inspect.tensor_stats.default


def sample_inputs():
    g = torch.Generator().manual_seed(0)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 7e4, 1e-30, 3e-8, 500.0])
    return [
        ([torch.randn(100, generator=g), torch.randn(3, 4, generator=g).half()], None, None, ["fp16"]),
        ([torch.randn(2049, generator=g) * 1e4, special, torch.empty(0)], None, 2.0**16, list(ALL_FORMATS)),
        (
            [torch.randn(6, 7, generator=g).t(), torch.randn(5, dtype=torch.float64)],
            torch.tensor(0.5),
            None,
            ["fp8_e4m3", "bf16"],
        ),
        (
            [torch.randn(10, generator=g).bfloat16(), torch.randn(1, 9, generator=g).expand(4, 9)],
            None,
            3.0,
            ["fp8_e5m2"],
        ),
        ([special.double(), torch.tensor(1.5)], None, None, ["bf16", "fp16", "fp8_e5m2"]),
    ]


@pytest.mark.parametrize("args", sample_inputs(), ids=lambda a: f"{len(a[0])}tensors-{'-'.join(a[3])}")
def test_opcheck(args):
    # Inputs do not require grad: the statistics are not differentiable and the Python entry point runs
    # the op under no_grad.
    results = torch.library.opcheck(OP, args)
    assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.xfail(
    strict=True,
    raises=NotImplementedError,
    reason="an empty Tensor[] gives the dispatcher no key and the op registers no fallback kernel; the "
    "Python entry point answers [] itself (test_only_empty_tensors_and_empty_list)",
)
def test_op_accepts_empty_list():
    counts, hist, *_ = OP([], None, None, ["fp16"])
    assert tuple(counts.shape) == (0, 8) and tuple(hist.shape) == (0, 256)


def test_torch_compile_fullgraph_matches_eager():
    def f(a, b, c):
        counts, hist, amax, amin, sumsq = torch.ops.amp_inspect.tensor_stats(
            [a * 2, b, c], None, 4.0, ["fp16", "fp8_e4m3"]
        )
        return counts.sum(dim=0), hist, amax + 1, amin, sumsq.sqrt()

    g = torch.Generator().manual_seed(1)
    a = torch.randn(3000, generator=g) * 1e4
    b = torch.randn(50, generator=g).half()
    c = torch.tensor([float("nan"), 1e-40, 0.0, 200.0], dtype=torch.float64)
    compiled = torch.compile(f, fullgraph=True)
    for got, want in zip(compiled(a, b, c), f(a, b, c), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0, equal_nan=True)


@pytest.mark.parametrize("scale", [None, 3.0])
def test_torch_compile_fullgraph_public_entry_point(scale):
    def f(a, b):
        stats = amp_inspect.tensor_stats([a, b], scale=scale, formats=("fp16", "bf16"))
        return stats.overflow, stats.underflow, stats.nan, stats.hist, stats.amax, stats.sumsq

    g = torch.Generator().manual_seed(2)
    a = torch.randn(1000, generator=g) * 1e5
    b = torch.tensor([float("nan"), 1e-30, 0.0, 7e4]).half()
    compiled = torch.compile(f, fullgraph=True)
    for got, want in zip(compiled(a, b), f(a, b), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0, equal_nan=True)


def test_torch_compile_fullgraph_public_entry_point_cpu_scale_tensor():
    def f(a, s):
        return amp_inspect.tensor_stats([a], scale=s).overflow

    a = torch.randn(100) * 1e5
    s = torch.tensor(0.5)
    assert torch.equal(torch.compile(f, fullgraph=True)(a, s), f(a, s))


def test_under_no_grad_and_with_grad_requiring_tensors():
    x = torch.randn(100, requires_grad=True)
    y = (x * 2).detach().requires_grad_()
    with torch.no_grad():
        raw = torch.ops.amp_inspect.tensor_stats([x, y], None, None, ["fp16"])
    oracles.assert_outputs_equal(raw, tensor_stats_reference([x, y], None, None, ["fp16"]))
    stats = amp_inspect.tensor_stats([x, y])  # the entry point runs the op under no_grad itself
    assert not any(t.requires_grad for t in (stats.numel, stats.amax, stats.sumsq, stats.hist, stats.overflow))
    for got, want in zip((stats.hist, stats.amax, stats.amin_nonzero, stats.sumsq), raw[1:], strict=True):
        assert torch.equal(got, want)


# ---------------------------------------------------------------------------------------------------------
# bad inputs: TypeError / ValueError from the Python entry point, naming the tensor's position


def _ok(n=3):
    return [torch.ones(n) for _ in range(n)]


def _sparse_csr() -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        return torch.eye(3).to_sparse_csr()


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (None, TypeError, "tensor 3 is None"),
        (1.5, TypeError, "tensor 3 is a float"),
        (np.ones(3, dtype=np.float32), TypeError, "tensor 3 is a ndarray"),
        (torch.ones(3, dtype=torch.int32), TypeError, "tensor 3 has dtype torch.int32"),
        (torch.ones(3, dtype=torch.int64), TypeError, "tensor 3 has dtype torch.int64"),
        (torch.ones(3, dtype=torch.uint8), TypeError, "tensor 3 has dtype torch.uint8"),
        (torch.ones(3, dtype=torch.bool), TypeError, "tensor 3 has dtype torch.bool"),
        (torch.ones(3, dtype=torch.complex64), TypeError, "tensor 3 has dtype torch.complex64"),
        (torch.ones(3, dtype=torch.float8_e4m3fn), TypeError, "tensor 3 has dtype torch.float8_e4m3fn"),
        (torch.ones(3).to_sparse(), TypeError, "tensor 3 has layout torch.sparse_coo"),
        (_sparse_csr(), TypeError, "tensor 3 has layout torch.sparse_csr"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_bad_tensor(bad, error, message):
    tensors = [*_ok(), bad, torch.ones(2)]
    with pytest.raises(error, match=message):
        amp_inspect.tensor_stats(tensors)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [(torch.ones(3), "wrap a single tensor"), (5, "tensors must be a list of tensors, got int")],
)
def test_bad_tensor_list(tensors, message):
    with pytest.raises(TypeError, match=message):
        amp_inspect.tensor_stats(tensors)


@pytest.mark.parametrize(
    ("formats", "error", "message"),
    [
        (("fp16", "fp32"), ValueError, "unknown format 'fp32'"),
        (("e4m3",), ValueError, "unknown format 'e4m3'"),
        ((), ValueError, "at least one format"),
        ([], ValueError, "at least one format"),
        (("fp16", "bf16", "fp16"), ValueError, "lists a format twice"),
        (5, TypeError, "sequence of format names"),
    ],
)
def test_bad_formats(formats, error, message):
    with pytest.raises(error, match=message):
        amp_inspect.tensor_stats(_ok(), formats=formats)


def test_single_format_name_as_string():
    stats = amp_inspect.tensor_stats(_ok(), formats="bf16")
    assert stats.formats == ("bf16",)


@pytest.mark.parametrize(
    ("scale", "error", "message"),
    [
        (float("nan"), ValueError, "finite and positive"),
        (float("inf"), ValueError, "finite and positive"),
        (-float("inf"), ValueError, "finite and positive"),
        (0.0, ValueError, "finite and positive"),
        (0, ValueError, "finite and positive"),
        (-2.0, ValueError, "finite and positive"),
        (1e-50, ValueError, "as a float32"),  # underflows float32
        (1e39, ValueError, "as a float32"),  # overflows float32
        (True, TypeError, "got bool"),
        (False, TypeError, "got bool"),
        ("2.0", TypeError, "got str"),
        (1 + 0j, TypeError, "got complex"),
        (torch.tensor(2.0, dtype=torch.float64), TypeError, "float32 tensor of one element"),
        (torch.tensor(2.0, dtype=torch.float16), TypeError, "float32 tensor of one element"),
        (torch.tensor([2.0, 3.0]), TypeError, "float32 tensor of one element"),
        (torch.ones(0), TypeError, "float32 tensor of one element"),
        (torch.tensor(float("nan")), ValueError, "finite and positive"),
        (torch.tensor(float("inf")), ValueError, "finite and positive"),
        (torch.tensor(0.0), ValueError, "finite and positive"),
        (torch.tensor(-1.0), ValueError, "finite and positive"),
    ],
    ids=repr,
)
def test_bad_scale(scale, error, message):
    with pytest.raises(error, match=message):
        amp_inspect.tensor_stats(_ok(), scale=scale)


@pytest.mark.parametrize("scale", [2, 0.5, np.float32(3.0), np.float64(2.0**-20), torch.tensor([4.0]), 3.4e38])
def test_good_scales(scale):
    x = torch.tensor([1.0, 1e-3, 1e5])
    stats = amp_inspect.tensor_stats([x], scale=scale)
    oracles.assert_stats_match_oracle(stats, [x], float(np.float32(float(scale))))


def test_op_level_errors():
    """The op itself checks what a direct caller could get wrong."""
    x = [torch.ones(3)]
    with pytest.raises(RuntimeError, match="unknown format 'fp32'"):
        torch.ops.amp_inspect.tensor_stats(x, None, None, ["fp32"])
    with pytest.raises(RuntimeError, match="listed twice"):
        torch.ops.amp_inspect.tensor_stats(x, None, None, ["bf16", "bf16"])
    with pytest.raises(RuntimeError, match="at least one format"):
        torch.ops.amp_inspect.tensor_stats(x, None, None, [])
    with pytest.raises(RuntimeError, match="not both"):
        torch.ops.amp_inspect.tensor_stats(x, torch.tensor(2.0), 2.0, ["fp16"])
    with pytest.raises(RuntimeError, match="finite and positive"):
        torch.ops.amp_inspect.tensor_stats(x, None, -1.0, ["fp16"])
    with pytest.raises(RuntimeError, match="not a finite positive float32"):
        torch.ops.amp_inspect.tensor_stats(x, None, 1e-50, ["fp16"])
    with pytest.raises(RuntimeError, match="float32 tensor of one element"):
        torch.ops.amp_inspect.tensor_stats(x, torch.tensor(2.0, dtype=torch.float64), None, ["fp16"])
    with pytest.raises(RuntimeError, match="finite and positive"):
        torch.ops.amp_inspect.tensor_stats(x, torch.tensor(0.0), None, ["fp16"])
    with pytest.raises(RuntimeError, match="tensor 1 has dtype"):
        torch.ops.amp_inspect.tensor_stats([torch.ones(2), torch.ones(2, dtype=torch.int32)], None, None, ["fp16"])
    with pytest.raises(RuntimeError, match="at most 4 formats"):
        torch.ops.amp_inspect.tensor_stats(x, None, None, ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp16"])


@pytest.mark.parametrize(
    "call",
    [
        lambda: torch.ops.amp_inspect.tensor_stats([torch.ones(3), torch.ones(3, device="meta")], None, None, ["fp16"]),
        lambda: torch.ops.amp_inspect.tensor_stats([torch.ones(3, device="meta"), torch.ones(3)], None, None, ["fp16"]),
        lambda: torch.ops.amp_inspect.tensor_stats([torch.ones(3)], torch.ones((), device="meta"), None, ["fp16"]),
        lambda: torch.ops.amp_inspect.unscale_stats_(
            [torch.ones(3)], torch.ones((), device="meta"), torch.zeros(1), ["fp16"]
        ),
        lambda: torch.ops.amp_inspect.unscale_stats_(
            [torch.ones(3)], torch.ones(()), torch.zeros(1, device="meta"), ["fp16"]
        ),
    ],
    ids=["meta-tensor-after-cpu", "meta-tensor-first", "meta-scale", "meta-inv-scale", "meta-found-inf"],
)
def test_raw_op_refuses_meta_among_cpu_inputs(call):
    """Issue 18, case 7: the dispatcher sends any call holding a meta tensor to the fake kernel, which used
    to answer with empty outputs; the op now refuses it in one sentence, as it refuses CPU with CUDA."""
    with pytest.raises(RuntimeError, match=r"amp_inspect\.\w+: .* is on (meta|cpu) but .* one device per call"):
        call()


def test_raw_op_on_meta_inputs_alone_gives_shapes():
    """All inputs on meta is shape inference (what the fake kernel is for): outputs of the right shapes."""
    out = torch.ops.amp_inspect.tensor_stats([torch.ones(3, device="meta")] * 2, None, None, ["fp16", "bf16"])
    assert [tuple(t.shape) for t in out] == [(2, 11), (2, 256), (2,), (2,), (2,)]
    assert all(t.device.type == "meta" for t in out)


def test_caller_tensors_unmodified():
    """Bitwise, NaN payloads included, for every dtype and layout, with and without a scale."""
    nan_payloads = torch.tensor([0x7FC00001, 0x7F800001, -0x00400001, 0x7FBFFFFF], dtype=torch.int32)
    tensors = [
        torch.cat([nan_payloads.view(torch.float32), torch.tensor([1e-40, -0.0, 7e4])]),
        torch.tensor([0x7E01, 0x7C01, -0x0001, 0x0001], dtype=torch.int16).view(torch.float16),
        torch.tensor([0x7F81, 0x7FC1, -0x0001], dtype=torch.int16).view(torch.bfloat16),
        torch.tensor([0x7FF0000000000001, 0x7FF8000000000123, 1], dtype=torch.int64).view(torch.float64),
        torch.randn(40, 30).t()[::3],
        torch.randn(5, 1).expand(5, 100),
    ]
    snapshots = [(t.clone(), t.stride(), t.storage_offset()) for t in tensors]
    scale = torch.tensor(2.0)
    for kwargs in ({}, {"scale": 3.0}, {"scale": scale}):
        amp_inspect.tensor_stats(tensors, formats=ALL_FORMATS, **kwargs)
        torch.ops.amp_inspect.tensor_stats(tensors, None, None, list(ALL_FORMATS))
    for (copy, stride, offset), t in zip(snapshots, tensors, strict=True):
        assert oracles.bits_equal(copy, t)
        assert (t.stride(), t.storage_offset()) == (stride, offset)
    assert float(scale) == 2.0


def test_tensor_stats_object():
    stats = amp_inspect.tensor_stats([torch.tensor([1.0, float("inf"), float("nan"), 3.0])], formats=("bf16", "fp16"))
    assert len(stats) == 1
    assert stats.column("fp16") == 1
    with pytest.raises(KeyError, match="was not requested"):
        stats.column("fp8_e4m3")
    assert int(stats.nonfinite[0]) == 2
    assert float(stats.norm[0]) == pytest.approx(10**0.5)


# ---------------------------------------------------------------------------------------------------------
# what was built


def test_cpu_kernel_registered():
    assert _ops.extension_loaded(), _ops.LOAD_ERROR
    assert _ops.has_kernel("cpu")
    assert _ops.build_info()["cpu"] == "1"


@pytest.mark.skipif(
    _ops.build_info().get("cuda") != "1",
    reason="built without CUDA kernels (no GPU and no TORCH_CUDA_ARCH_LIST, no nvcc, or AMP_INSPECT_NO_CUDA=1)",
)
def test_cuda_kernel_registered_when_the_build_holds_them():
    """Needs no GPU: whenever the build compiled the CUDA kernels (make test-no-toolkit, the wheel), their library
    loads beside a torch of their CUDA major and registers them with the dispatcher."""
    assert _ops.has_kernel("cuda")
    info = _ops.build_info()
    assert info["cuda"] == "1"
    assert info.get("cuda_archs"), info


def test_info_command():
    result = subprocess.run(
        [sys.executable, "-m", "amp_inspect.info"], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = {line.split("  ")[0].strip(): line for line in result.stdout.splitlines()}
    assert "CUDA kernel" in lines and "CPU kernel" in lines, result.stdout
    assert lines["CPU kernel"].split()[-1] == "yes"
    # "yes", or "NO: <why>; ..." (the reason and the fix follow on a CUDA torch built without the kernels)
    cuda_answer = lines["CUDA kernel"].removeprefix("CUDA kernel").split()[0].rstrip(":").lower()
    assert cuda_answer == ("yes" if _ops.has_kernel("cuda") else "no"), result.stdout
    assert "extension loaded" in lines and lines["extension loaded"].split()[-1] == "yes"


# ---------------------------------------------------------------------------------------------------------
# fallback: the compiled extension cannot load


FALLBACK_SCRIPT = textwrap.dedent(
    """
    import importlib.abc, sys, warnings

    class BlockExtension(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "amp_inspect._C":
                raise ImportError("blocked by the test")
            return None

    sys.meta_path.insert(0, BlockExtension())
    import torch
    import amp_inspect
    from amp_inspect.core import ops as _ops

    assert not _ops.extension_loaded() and "blocked by the test" in _ops.LOAD_ERROR
    assert not _ops.has_kernel("cpu") and _ops.build_info() == {}
    inputs = torch.load(sys.argv[1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [amp_inspect.tensor_stats(inputs, formats=("fp16", "fp8_e4m3"), scale=s) for s in (None, 3.0)]
        amp_inspect.tensor_stats(inputs)
        amp_inspect.tensor_stats(inputs[:1])
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in caught]
    assert "reference" in str(runtime[0].message), runtime[0].message
    assert "amp_inspect._C" in str(runtime[0].message), runtime[0].message
    torch.save([[getattr(r, f) for f in ("numel", "nan", "posinf", "neginf", "zero", "overflow", "subnormal",
                                           "underflow", "amax", "amin_nonzero", "sumsq", "hist")] for r in results],
               sys.argv[2])
    print("FALLBACK OK")
    """
)


def test_fallback_without_extension(tmp_path):
    """With ``import amp_inspect._C`` failing, tensor_stats still works, warns exactly once (mentioning the
    reference) over several calls, and gives what the compiled kernel gives here."""
    g = torch.Generator().manual_seed(3)
    inputs = [
        torch.randn(3000, generator=g) * 1e4,
        torch.tensor([float("nan"), float("inf"), 0.0, 1e-30, 500.0]).half(),
        torch.randn(20, generator=g, dtype=torch.float64).t(),
        torch.randn(4, 5, generator=g).bfloat16().t(),
    ]
    torch.save(inputs, tmp_path / "inputs.pt")
    result = subprocess.run(
        [sys.executable, "-c", FALLBACK_SCRIPT, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FALLBACK OK" in result.stdout
    fallback = torch.load(tmp_path / "out.pt")
    for fields, scale in zip(fallback, (None, 3.0), strict=True):
        compiled = amp_inspect.tensor_stats(inputs, formats=("fp16", "fp8_e4m3"), scale=scale)
        names = (
            "numel",
            "nan",
            "posinf",
            "neginf",
            "zero",
            "overflow",
            "subnormal",
            "underflow",
            "amax",
            "amin_nonzero",
            "sumsq",
            "hist",
        )
        for name, value in zip(names, fields, strict=True):
            want = getattr(compiled, name)
            if name == "sumsq":
                torch.testing.assert_close(value, want, rtol=2e-6, atol=0)
            else:
                assert torch.equal(value, want), name


# ---- meta and mixed devices ----


def test_meta_tensor_in_tensor_stats_is_one_clear_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "built without it" warning first
        with pytest.raises(ValueError, match="tensor 1 is on the meta device"):
            amp_inspect.tensor_stats([torch.ones(3), torch.ones(3, device="meta")])
        with pytest.raises(ValueError, match="scale tensor is on the meta device"):
            amp_inspect.tensor_stats([torch.ones(3)], scale=torch.ones((), device="meta"))


def test_the_op_refuses_mixed_and_meta_devices_instead_of_running_the_fake_kernel() -> None:
    grads = [torch.full((4,), 8.0), torch.full((2,), 8.0, device="meta")]
    found = torch.zeros(())
    with pytest.raises(ValueError, match="tensor 1 is on the meta device"):
        unscale_stats_op(grads, torch.full((), 0.5), found, ["fp16"])
    cpu = [torch.full((4,), 8.0)]
    with pytest.raises(ValueError, match="inv_scale is on the meta device"):
        unscale_stats_op(cpu, torch.full((), 0.5, device="meta"), found, ["fp16"])
    assert torch.equal(cpu[0], torch.full((4,), 8.0))  # not silently left "unscaled" by a fake kernel
    with pytest.raises(ValueError, match="scale is on the meta device"):
        tensor_stats_op(cpu, torch.ones((), device="meta"), None, ["fp16"])
    outputs = unscale_stats_op(cpu, torch.full((), 0.5), found, ["fp16"])
    assert torch.equal(cpu[0], torch.full((4,), 4.0)) and int(outputs[0][0, 0]) == 4


def test_scaled_statistics_ignore_the_cpus_flush_to_zero_mode() -> None:
    # float32(x) * scale as the GPU's multiply rounds it (never flushed): with set_flush_denormal(True) the CPU's
    # float multiply gave zero 3, subnormal 0, amin 0.5 here. The amin's bits are read as int32 (reading the
    # float under denormals-are-zero would itself say 0).
    x = torch.tensor([1e-39, 2e-38, 1.0, 0.0]).bfloat16()
    seen = []
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        try:
            stats = amp_inspect.tensor_stats([x], scale=0.5, formats=("bf16",))
            seen.append((stats.zero.tolist(), stats.subnormal.tolist(), stats.amin_nonzero.view(torch.int32).item()))
        finally:
            torch.set_flush_denormal(False)
    expected_amin = (torch.tensor(1e-39).bfloat16().float() * 0.5).view(torch.int32).item()
    assert seen[0] == seen[1] == ([1], [[2]], expected_amin)
    unscaled = amp_inspect.tensor_stats([x], formats=("bf16",))  # the unscaled path, as before: 2e-38 is normal
    assert unscaled.zero.tolist() == [1] and unscaled.subnormal.tolist() == [[1]]
