"""One small call of every CUDA kernel variant, for compute-sanitizer (bench/gpu_check.sh runs this under
memcheck, racecheck and synccheck): 1-4 formats x plain / scaled / unscale, dense, unaligned and strided
views of every dtype, a call with more tensors than fit in a launch's parameters (device table), and the
same under CUDA graph capture (one launch per group of tensors). Prints one line per call and "ok" at the end."""

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
    torch.cuda.synchronize()
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
