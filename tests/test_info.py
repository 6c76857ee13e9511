"""``python -m amp_inspect.info``: which GPUs the built images cover (pure logic, no GPU needed)."""

from __future__ import annotations

import pytest

from amp_inspect.cli.info import collect
from amp_inspect.core import ops as _ops
from amp_inspect.core.ops import built_images, covers

DEFAULT_IMAGES = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "compute_120", "sm_120"]


@pytest.mark.parametrize(
    ("capability", "covered"),
    [
        ((8, 0), True),  # A100
        ((8, 6), True),  # RTX 30xx, A10
        ((8, 7), True),  # Orin: the sm_86 cubin runs there (same major, lower minor)
        ((8, 9), True),  # RTX 40xx, L4
        ((9, 0), True),  # H100, H200
        ((10, 0), True),  # B200
        ((10, 3), True),  # B300: the sm_100 cubin
        ((12, 0), True),  # RTX 50xx
        ((12, 1), True),
        ((13, 0), True),  # a later GPU: compute_120 PTX
        ((7, 5), False),  # Turing: below Ampere
        ((11, 0), False),  # sm_110: no cubin of major 11 and the PTX is newer
    ],
)
def test_default_images_cover_ampere_to_blackwell(capability, covered):
    assert covers(DEFAULT_IMAGES, capability) is covered


def test_no_ptx_means_no_later_gpu():
    assert not covers(["sm_80", "sm_90"], (10, 0))
    assert covers(["sm_80", "sm_90"], (9, 0))


def test_the_built_binary_holds_the_default_images_and_info_lists_them():
    if _ops.build_info().get("cuda") != "1":
        pytest.skip("built without CUDA kernels")
    images = built_images()
    assert images, "a CUDA build must name its images"
    info = collect()
    assert info["GPU images built"] == " ".join(images)


def test_the_images_info_names_are_the_ones_in_the_binary():
    """What info says was built is what the library holds (read back with cuobjdump, where one is at hand)."""
    import re
    import shutil
    import subprocess
    from pathlib import Path

    import amp_inspect._C as extension

    if _ops.build_info().get("cuda") != "1":
        pytest.skip("built without CUDA kernels")
    tool = shutil.which("cuobjdump")
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        tool = str(bundled) if bundled.exists() else tool
    except ImportError:
        pass
    if tool is None:
        pytest.skip("no cuobjdump to read the binary with")
    # The CUDA kernels are a library of their own beside _C (amp_inspect/core/_native.py loads it).
    cuda_library = str(next(Path(extension.__file__).parent.glob("_C_cuda*.so")))
    listing = subprocess.run(
        [tool, "--list-elf", "--list-ptx", cuda_library], capture_output=True, text=True, check=True
    ).stdout
    held = {f"sm_{n}" for n in re.findall(r"ELF file.*\.sm_(\d+)\.cubin", listing)}
    held |= {f"compute_{n}" for n in re.findall(r"PTX file.*\.sm_(\d+)\.ptx", listing)}
    assert held == set(built_images())
