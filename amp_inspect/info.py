"""``python -m amp_inspect.info``: what was built and what this machine can run.

Prints torch's and CUDA's versions, which tensor_stats kernels the compiled extension registered (CPU,
CUDA and the CUDA architectures it was built for) and whether a GPU is visible.
"""

from __future__ import annotations

import sys

import torch

from . import _ops


def collect() -> dict[str, str]:
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch CUDA build": torch.version.cuda or "no (CPU-only torch)",
        "extension loaded": "yes" if _ops.extension_loaded() else f"no ({_ops.LOAD_ERROR})",
        "CPU kernel": "yes" if _ops.has_kernel("cpu") else "no",
        "CUDA kernel": "yes" if _ops.has_kernel("cuda") else "no",
    }
    built = _ops.build_info()
    if built.get("cuda") == "1":
        info["CUDA archs built"] = built.get("cuda_archs", "?")
    # Asking whether a GPU is visible initialises CUDA; fine in this one-off command.
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    info["GPU visible"] = "no" if gpus == 0 else ", ".join(torch.cuda.get_device_name(i) for i in range(gpus))
    return info


def main() -> None:
    info = collect()
    width = max(map(len, info))
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
