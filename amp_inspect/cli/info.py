"""``python -m amp_inspect.info``: what was built and what this machine can run.

Prints torch's and CUDA's versions, which tensor_stats kernels the compiled extension registered (CPU,
CUDA; on a CUDA or ROCm torch without the CUDA kernels, why not and the command that fixes it), the GPU
images the binary holds (``sm_XY``: machine code for compute capability X.Y and the later X.* of the same
major; ``compute_XY``: PTX the driver compiles for X.Y and every later GPU), and whether each visible GPU is
covered.
"""

from __future__ import annotations

import sys

import torch

from amp_inspect.core import ops as _ops
from amp_inspect.core.ops import built_images


def collect() -> dict[str, str]:
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch CUDA build": torch.version.cuda or "no (CPU-only torch)",
        "extension loaded": "yes" if _ops.extension_loaded() else f"no ({_ops.LOAD_ERROR})",
        "CPU kernel": "yes" if _ops.has_kernel("cpu") else "no",
        "CUDA kernel": "yes" if _ops.has_kernel("cuda") else "no",
    }
    missing = _ops.cuda_kernels_missing()
    if missing is not None:  # a GPU torch without the GPU kernels: the one case a user must not miss
        info["CUDA kernel"] = (
            f"NO: {missing}; GPU tensors get the pure-torch fallback (exact, no host sync, several times slower)"
        )
        info["fix"] = _ops.cuda_fix()
    images = built_images()
    if images:
        info["GPU images built"] = " ".join(images)
    # Asking whether a GPU is visible initialises CUDA; fine in this one-off command.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus == 0:
        info["GPU visible"] = "no"
    for i in range(gpus):
        capability = torch.cuda.get_device_capability(i)
        name = f"{torch.cuda.get_device_name(i)} (sm_{capability[0]}{capability[1]})"
        if not images:
            verdict = "not served: the extension has no CUDA kernels (the pure-torch fallback runs; see fix)"
        elif _ops.cuda_device_supported(i):
            verdict = "covered"
        else:
            verdict = "not covered by this binary (the pure-torch reference runs); rebuild for it"
        info[f"GPU {i}"] = f"{name}: {verdict}"
    return info


def main() -> None:
    info = collect()
    width = max(map(len, info))
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
