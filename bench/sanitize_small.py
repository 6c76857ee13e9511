"""One small call of every CUDA kernel variant, for compute-sanitizer (bench/gpu_check.sh runs this under
memcheck, racecheck and synccheck): 1-4 formats x plain / scaled / unscale, dense, unaligned and strided
views of every dtype, a call with more tensors than fit in a launch's parameters (device table), and the
same under CUDA graph capture (one launch per group of tensors); then format_readiness and update_stats. Prints
one line per call and "ok" at the end."""

from __future__ import annotations

import sys

import torch

FORMATS = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def tensors(count: int = 6) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        dtype = DTYPES[i % 4]
        base = (torch.randn(3000 + 17 * i, generator=g) * 1e3).to(dtype).cuda()
        out.append(base[i % 3 :])  # unaligned starts
    out.append((torch.randn(40, 30, generator=g)).cuda().t())  # strided
    out[0][5] = float("nan")
    return out


def readiness_and_updates() -> None:
    """format_readiness (every recipe; measured and given tensor amax) and update_stats (with and without Adam
    state) on small tensors of each input dtype, rows with ragged block tails, and more tensors than a launch holds."""
    from amp_inspect import format_readiness, update_stats

    g = torch.Generator().manual_seed(1)
    small = [(torch.randn(5, 200 + 33 * i, generator=g) * 10 ** (i - 3)).to(d).cuda() for i, d in enumerate(DTYPES[:3])]
    small[0][0, 7] = float("inf")
    format_readiness(small)
    format_readiness(small, tensor_amax=[1.0, 2.0, 3.0])
    format_readiness(small * 14)
    print("format_readiness: every recipe, measured and given amax, 42 tensors")
    for dtype in DTYPES[:3]:
        before = [torch.randn(1000 + 7 * i, generator=g).to(dtype).cuda() for i in range(40)]
        after = [(b.float() + 1e-3).to(dtype) for b in before]
        grads = [torch.randn_like(b) for b in before]
        update_stats(before, after, grads)
        update_stats(before, after, grads, [torch.rand_like(b.float()).to(dtype) * 1e-6 for b in before])
    print("update_stats: each dtype, with and without exp_avg_sq, 40 tensors")


def main() -> int:
    if not torch.cuda.is_available():
        print("error: sanitize_small.py calls the CUDA kernels, and torch sees no CUDA GPU here")
        return 2
    import amp_inspect  # noqa: F401  (loads the ops)

    ops = torch.ops.amp_inspect
    for f in range(1, 5):
        formats = FORMATS[:f]
        ops.tensor_stats(tensors(), None, None, formats)
        ops.tensor_stats(tensors(), None, 1024.0, formats)
        ops.tensor_stats(tensors(), torch.tensor(2.0, device="cuda"), None, formats)
        ops.unscale_stats_(tensors(), torch.tensor(0.5, device="cuda"), torch.zeros((), device="cuda"), formats)
        print(f"{f} format(s): plain, scaled (value and tensor), unscale")
    ops.tensor_stats(tensors(40), None, None, FORMATS)
    print("40 tensors: device table")
    many = tensors(40)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ops.tensor_stats(many, None, None, ["fp16"])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ops.tensor_stats(many, None, None, ["fp16"])
    graph.replay()
    print("40 tensors under graph capture: inline launches, replayed")
    readiness_and_updates()
    torch.cuda.synchronize()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
