"""The AMP doctor's environment checks: the torch build, the GPUs, TF32, amp_inspect's compiled extension and
the hardware monitor, each registered with ``@environment_check`` (amp_inspect/diagnosis/findings.py); and the findings
from the hardware readings of a run log (the machine as the run saw it).

Cost: the environment checks initialise CUDA and NVML: they are for ``amp-inspect doctor``, not for the
training loop.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from amp_inspect.core import ops as _ops
from amp_inspect.core.ops import built_images, covers
from amp_inspect.core.printable import shown_name
from amp_inspect.diagnosis import findings
from amp_inspect.diagnosis.findings import Finding, environment_check
from amp_inspect.runlog import hardware

GPU_MEMORY_FULL = 0.95  # share of a GPU's memory in use (NVML) from which the doctor warns of out-of-memory risk
_GIB = float(1 << 30)


def _gpus() -> list[tuple[str, tuple[int, int]]]:
    """(name, compute capability) of each visible GPU; initialises CUDA."""
    if not torch.cuda.is_available():
        return []
    return [
        (torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())
    ]


@environment_check
def torch_build() -> Iterator[Finding]:
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    cuda = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA (a CPU-only build)"
    yield Finding(
        "torch-build", "info", f"torch {torch.__version__}, built with {cuda}" + (f", cuDNN {cudnn}" if cudnn else "")
    )


def _capability_verdict(name: str, cap: tuple[int, int], count: int) -> Finding:
    label = f"{count} x {name}" if count > 1 else name
    label = f"{label} (compute capability {cap[0]}.{cap[1]})"
    if cap < (7, 0):
        return Finding(
            "no-tensor-cores",
            "warning",
            f"{label} has no tensor cores: fp16 autocast saves memory but little time, and bf16 is emulated.",
            "expect AMP speed-ups only on compute capability 7.0+ GPUs (V100, T4, A100, H100, ...).",
        )
    if cap < (8, 0):
        return Finding(
            "gpu",
            "info",
            f"{label}: fp16 tensor cores; no native bf16.",
            "use `torch.autocast('cuda', dtype=torch.float16)` with a GradScaler on this GPU.",
        )
    fp8 = ", fp8" if cap >= (8, 9) else ""
    return Finding(
        "gpu",
        "info",
        f"{label}: fp16, bf16{fp8} and TF32 tensor cores.",
        "bf16 autocast (`dtype=torch.bfloat16`, no GradScaler) is the simpler choice on this GPU.",
    )


@environment_check
def gpus() -> Iterator[Finding]:
    found = _gpus()
    if not found:
        build = "" if torch.version.cuda else " (this torch has no CUDA support)"
        yield Finding(
            "no-gpu",
            "info",
            f"no GPU visible{build}: CUDA autocast and GradScaler('cuda') cannot run here; CPU autocast runs bf16 "
            "by default, and fp16 when asked (dtype=torch.float16, with GradScaler('cpu')).",
        )
        return
    for (name, cap), count in Counter(found).items():
        yield _capability_verdict(name, cap, count)


@environment_check
def tf32() -> Iterator[Finding]:
    with warnings.catch_warnings():  # the allow_tf32 flags are being superseded by fp32_precision; still read
        warnings.simplefilter("ignore")
        matmul = torch.backends.cuda.matmul.allow_tf32
        cudnn = torch.backends.cudnn.allow_tf32
    on = {True: "on", False: "off"}
    ampere = any(cap >= (8, 0) for _, cap in _gpus())
    fix = ""
    if not matmul and ampere:
        fix = (
            "`torch.backends.cuda.matmul.allow_tf32 = True` (or `torch.set_float32_matmul_precision('high')`) runs "
            "the float32 matmuls outside autocast on tensor cores, at 10 mantissa bits."
        )
    yield Finding(
        "tf32",
        "info",
        f"TF32 for float32 matmuls is {on[bool(matmul)]} (torch.backends.cuda.matmul.allow_tf32) and for cuDNN "
        f"convolutions {on[bool(cudnn)]} (torch.backends.cudnn.allow_tf32).",
        fix,
    )


@environment_check
def extension() -> Iterator[Finding]:
    rebuild = "rebuild with `pip install --no-build-isolation -e .`, then check `python -m amp_inspect.info`."
    if not _ops.extension_loaded():
        yield Finding(
            "extension-not-loaded",
            "warning",
            f"the compiled extension amp_inspect._C did not load ({_ops.LOAD_ERROR}): amp_inspect falls back to its "
            "pure-torch reference, exact but several times slower.",
            rebuild,
        )
        return
    gpus_found = _gpus()
    built = _ops.build_info()
    if not _ops.has_kernel("cpu"):
        yield Finding("no-cpu-kernel", "warning", "the compiled extension has no CPU kernel.", rebuild)
    missing = _ops.cuda_kernels_missing()
    if missing is not None:  # a GPU torch without the GPU kernels, whether or not a GPU is visible right now
        yield Finding(
            "no-cuda-kernel",
            "warning",
            f"this torch is a GPU build but amp_inspect has no CUDA kernels: {missing}. GPU tensors get the "
            "pure-torch fallback (exact, no host sync, several times slower than the fused kernel).",
            _ops.cuda_fix() + "; then `python -m amp_inspect.info` says CUDA kernel: yes.",
        )
    archs = built.get("cuda_archs", "")
    images = built_images()
    missing = sorted({f"{n} ({c[0]}.{c[1]})" for n, c in gpus_found if not covers(images, c)})
    if _ops.has_kernel("cuda") and missing:
        yield Finding(
            "cuda-arch-missing",
            "warning",
            f"the CUDA kernel was built for {archs}, which does not run on {', '.join(missing)}.",
            "rebuild with TORCH_CUDA_ARCH_LIST including this GPU's capability, e.g. "
            "`TORCH_CUDA_ARCH_LIST='8.0;9.0' pip install --no-build-isolation -e .`.",
        )
    kernels = ", ".join(k for k in ("cpu", "cuda") if _ops.has_kernel(k)) or "none"
    yield Finding(
        "extension",
        "info",
        f"compiled extension loaded; kernels: {kernels}" + (f" (CUDA archs {archs})" if archs else "") + ".",
    )


@environment_check
def hardware_monitor() -> Iterator[Finding]:
    message = hardware.note()
    if message:
        yield Finding("hardware-monitor", "info", message)


def check_environment() -> list[Finding]:
    """Findings about torch, the GPUs, TF32 and amp_inspect's compiled extension (initialises CUDA and NVML)."""
    return [finding for fn in findings.ENVIRONMENT_CHECKS for finding in fn()]  # as registered when called


def log_hardware_findings(records: Sequence[dict[str, Any]]) -> list[Finding]:
    """Peaks of the ``"hardware"`` readings of a run log's records (amp_inspect.runlog.hardware keys), their
    ``"hardware_note"``s, and a warning when the GPU's memory came close to full."""
    # A note the environment check gives for this machine too (the run ran here) is said once, by that check.
    here = hardware.note()
    out = [
        Finding("hardware-note", "info", f"in the run: {shown_name(note, limit=None)}")
        for note in dict.fromkeys(str(r["hardware_note"]) for r in records if r.get("hardware_note"))
        if note != here
    ]
    readings = [(r.get("step"), r["hardware"]) for r in records if isinstance(r.get("hardware"), dict)]

    def reading(h: dict[str, Any], key: str) -> float | None:
        """A reading as a number, None where absent or not one a machine reports (a log from elsewhere)."""
        value = h.get(key)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
        return float(value) if ok else None

    def peak(key: str) -> float | None:
        values = [v for _, h in readings if (v := reading(h, key)) is not None]
        return max(values) if values else None

    parts = []
    if (rss := peak("rss_bytes")) is not None:
        parts.append(f"process RSS {rss / _GIB:.2f} GiB")
    if (torch_peak := peak("torch_peak")) is not None:
        parts.append(f"torch peak allocated {torch_peak / _GIB:.2f} GiB")
    if (reserved := peak("torch_reserved")) is not None:
        parts.append(f"torch reserved {reserved / _GIB:.2f} GiB")
    if (used := peak("gpu_mem_used")) is not None and (total := peak("gpu_mem_total")):
        parts.append(f"GPU memory used {used / _GIB:.2f} of {total / _GIB:.2f} GiB")
    if (temp := peak("gpu_temp")) is not None:
        parts.append(f"GPU temperature {temp:g} C")
    if parts:
        out.append(Finding("hardware", "info", "peaks over the run: " + ", ".join(parts)))
    full = [
        (used / total, step)
        for step, h in readings
        if (used := reading(h, "gpu_mem_used")) is not None and (total := reading(h, "gpu_mem_total"))
    ]
    if full and max(full)[0] >= GPU_MEMORY_FULL:
        share, step = max(full)
        out.append(
            Finding(
                "gpu-memory-full",
                "warning",
                f"the GPU's memory was {share:.0%} used at step {step} (NVML, every process included): one larger "
                "batch or sequence away from an out-of-memory error.",
                "lower the batch size or checkpoint activations (torch.utils.checkpoint); if torch_reserved is far "
                "above torch_peak, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` reduces fragmentation.",
            )
        )
    return out
