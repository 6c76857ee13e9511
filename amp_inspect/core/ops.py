"""The only module that touches ``torch.ops.amp_inspect``: loads the compiled kernels, registers the fake
(meta) implementation torch.compile traces with, and falls back to the pure-torch reference, with one
clear warning, when the extension cannot load or was built without the kernel a device needs.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch

from amp_inspect.core.references.tensor_stats import tensor_stats_reference
from amp_inspect.core.statistics import new_outputs, new_readiness_outputs, new_update_outputs
from amp_inspect.core.torch_compat import non_finite_check_and_unscale_

OP_NAME = "amp_inspect::tensor_stats"
UNSCALE_OP_NAME = "amp_inspect::unscale_stats_"
READINESS_OP_NAME = "amp_inspect::format_readiness"
UPDATE_OP_NAME = "amp_inspect::update_stats"

# Loading the compiled libraries runs the op's registrations; CUDA_OFF: why the CUDA kernels are not loaded.
from amp_inspect.core._native import CUDA_LOADED, CUDA_OFF, LOAD_ERROR  # noqa: E402,F401

_warned: set[str] = set()
T = TypeVar("T")


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def extension_loaded() -> bool:
    return LOAD_ERROR is None


def build_info() -> dict[str, str]:
    """What the compiled extension was built with: {"cpu": "1", "cuda": "0" or "1", "cuda_archs": ...}."""
    if LOAD_ERROR is not None:
        return {}
    text = torch.ops.amp_inspect.build_info()
    return dict(item.split("=", 1) for item in text.splitlines())


def has_kernel(device_type: str) -> bool:
    """Whether the compiled extension registered a tensor_stats kernel for this device type ("cpu", "cuda")."""
    return device_type in OP_KERNELS["tensor_stats"]


_device_supported: dict[int, bool] = {}


def cuda_device_supported(index: int) -> bool:
    """Whether the binary holds a kernel image GPU ``index`` can run (asked once per GPU). A binary built
    without the GPU's architecture (and without PTX old enough for it) would fail with "no kernel image"."""
    if index not in _device_supported:
        ask = getattr(torch.ops.amp_inspect, "_cuda_device_supported", None) if LOAD_ERROR is None else None
        _device_supported[index] = bool(ask(index)) if ask is not None else False
    return _device_supported[index]


def _cuda_kernel_usable(device: torch.device) -> bool:
    """False (after one warning per GPU) where the binary cannot serve this GPU: the reference runs instead."""
    if torch.compiler.is_compiling():  # traced graphs call the op; checked on the eager calls before
        return True
    index = device.index if device.index is not None else torch.cuda.current_device()
    if cuda_device_supported(index):
        return True
    major, minor = torch.cuda.get_device_capability(index)
    _warn_once(
        f"cuda:{index}:image",
        f"amp_inspect: the compiled extension has no kernel for {torch.cuda.get_device_name(index)} "
        f"(sm_{major}{minor}; built for {build_info().get('cuda_archs', '?')}); using the exact pure-torch "
        f"reference for its tensors, which is much slower. Rebuild with TORCH_CUDA_ARCH_LIST={major}.{minor} "
        "`pip install --no-build-isolation -e .` and see `python -m amp_inspect.info`.",
    )
    return False


# The fix where a CUDA torch gets no CUDA kernels: rebuild from a checkout; the build finds a matching nvcc or
# fetches NVIDIA's from PyPI (CUDA 13; PyPI has no CUDA 12 nvcc, docs/install.md).
REBUILD_COMMAND = "pip install --no-build-isolation -e ."


def cuda_kernels_missing() -> str | None:
    """Why GPU tensors of this torch cannot get the compiled CUDA kernels, in one clause; None where they can
    (or where this torch has no GPU support). Reads the build, not the GPU: no CUDA initialisation."""
    if torch.version.hip is not None:
        return f"amp_inspect's GPU kernels are CUDA only and this torch is a ROCm (HIP {torch.version.hip}) build"
    if torch.version.cuda is None or has_kernel("cuda"):
        return None
    if LOAD_ERROR is not None:
        return f"the compiled extension amp_inspect._C did not load ({LOAD_ERROR})"
    built = build_info()
    have = torch.version.cuda.split(".")[0]
    if built.get("cuda") != "1":
        return (
            "the compiled extension was built without CUDA kernels (no GPU was visible and TORCH_CUDA_ARCH_LIST was "
            f"not set, AMP_INSPECT_NO_CUDA=1 was set, or no nvcc for CUDA {torch.version.cuda} was found when it was "
            "built)"
        )
    if built.get("cuda_major", have) != have:
        return f"its CUDA kernels were built for CUDA {built['cuda_major']} and this torch is a CUDA {have} build"
    return "the build lists CUDA kernels but they are not registered (their library did not load)"


def cuda_fix() -> str:
    """The command (with what it needs first) that builds the CUDA kernels for this torch."""
    if torch.version.hip is not None:
        return "none yet: use an NVIDIA GPU for the fused kernels"
    cuda = torch.version.cuda or "?"
    if cuda.split(".")[0] == "12":  # no nvcc for CUDA 12 on PyPI: a toolkit first
        return (
            f"install a CUDA {cuda} toolkit (e.g. `conda install -c nvidia cuda-nvcc={cuda} cuda-cudart-dev={cuda}`), "
            f"then `CUDA_HOME=<its prefix> {REBUILD_COMMAND}` in a checkout of amp_inspect"
        )
    return (
        f"`{REBUILD_COMMAND}` in a checkout of amp_inspect, on the machine with the GPU (elsewhere with "
        f"TORCH_CUDA_ARCH_LIST naming its arch, e.g. `TORCH_CUDA_ARCH_LIST=9.0 {REBUILD_COMMAND}`); it fetches "
        f"NVIDIA's nvcc for CUDA {cuda} if missing"
    )


def no_kernel_warning(device_type: str, op: str = "tensor_stats") -> str:
    """The one warning of the first call of ``op`` whose tensors no compiled kernel serves: why, what runs instead
    and what it costs, and the fix. One wording for every op."""
    fallback = f"{op} comes from the pure-torch reference as a fallback ({REFERENCE_COST[op]})"
    if LOAD_ERROR is not None:
        return (
            f"amp_inspect: no compiled {op} kernel for {device_type} tensors: the compiled extension amp_inspect._C "
            f"could not be loaded ({LOAD_ERROR}); {fallback}. Rebuild with `{REBUILD_COMMAND}` and see "
            "`python -m amp_inspect.info`."
        )
    if device_type == "cuda":
        why = cuda_kernels_missing() or "the compiled extension has no CUDA kernel"
        return (
            f"amp_inspect: NO CUDA KERNELS for GPU tensors: {why}; {fallback}. Fix: {cuda_fix()}; then "
            "`python -m amp_inspect.info` says CUDA kernel: yes."
        )
    if device_type == "cpu":
        return (
            f"amp_inspect: no compiled {op} kernel for cpu tensors (the extension was built without it); "
            f"{fallback}. Fix: `{REBUILD_COMMAND}` in a checkout of amp_inspect; see `python -m amp_inspect.info`."
        )
    return f"amp_inspect: no compiled {op} kernel for {device_type} tensors (CPU and CUDA only); {fallback}."


def _empty_outputs(tensors, formats) -> tuple[torch.Tensor, ...]:
    """The fake kernel's outputs: the schema's (amp_inspect/core/statistics.py), uninitialised."""
    device = tensors[0].device if tensors else torch.device("cpu")
    return new_outputs(len(tensors), formats, device, filled=False)


def _check_fake_devices(op: str, tensors, **others) -> None:
    """The fake kernel is also the op's Meta kernel, which the dispatcher picks whenever any input is a meta
    tensor: a meta tensor among CPU ones (or a meta scale) would get empty outputs instead of an error, so
    the fake refuses what the compiled kernels refuse, inputs on more than one device."""
    named = [(f"tensor {i}", t) for i, t in enumerate(tensors)]
    named += [(name, t) for name, t in others.items() if t is not None]
    if named and any(t.device != named[0][1].device for _, t in named):
        name, t = next((n, t) for n, t in named if t.device != named[0][1].device)
        raise RuntimeError(
            f"amp_inspect.{op}: {name} is on {t.device} but {named[0][0]} is on {named[0][1].device}; the op "
            "takes one device per call, and meta tensors hold no values to inspect"
        )


# A binary that loaded holds every op (core/_native.py refuses one without them), so the fakes register together.
if LOAD_ERROR is None:

    @torch.library.register_fake(OP_NAME)
    def _tensor_stats_fake(tensors, scale, scale_value, formats):
        _check_fake_devices("tensor_stats", tensors, scale=scale)
        return _empty_outputs(tensors, formats)

    @torch.library.register_fake(UNSCALE_OP_NAME)
    def _unscale_stats_fake(tensors, inv_scale, found_inf, formats):
        _check_fake_devices("unscale_stats_", tensors, inv_scale=inv_scale, found_inf=found_inf)
        return _empty_outputs(tensors, formats)

    @torch.library.register_fake(READINESS_OP_NAME)
    def _format_readiness_fake(tensors, recipes, tensor_amax):
        _check_fake_devices("format_readiness", tensors, tensor_amax=tensor_amax)
        device = tensors[0].device if tensors else torch.device("cpu")
        return new_readiness_outputs(len(tensors), len(recipes), device)

    @torch.library.register_fake(UPDATE_OP_NAME)
    def _update_stats_fake(before, after, grads, exp_avg_sq):
        _check_fake_devices("update_stats", [*before, *after, *grads, *exp_avg_sq])
        device = before[0].device if before else torch.device("cpu")
        return new_update_outputs(len(before), device, filled=False)


# Each op's reference and what it costs beside the kernel, for the one warning of a fallback.
REFERENCE_COST = {
    "tensor_stats": (
        "exact and with no host sync, but a few dozen torch ops and several passes over the values per call where "
        "the kernel makes one: several times slower"
    ),
    "format_readiness": "exact, but several passes per recipe and a host sync per call",
    "update_stats": "same outputs, about 15 torch ops per tensor where the kernel makes one pass; no host sync",
}
_OPS = ("tensor_stats", "unscale_stats_", "format_readiness", "update_stats")


def _registered(op: str) -> frozenset[str]:
    """The device types ("cpu", "cuda") the loaded libraries registered ``op``'s kernel for, as torch's
    dispatcher lists them (asked once, at import: torch.compile traces a constant, not a dispatcher query)."""
    if LOAD_ERROR is not None:
        return frozenset()
    overload = getattr(torch.ops.amp_inspect, op).default
    return frozenset(key.lower() for key in ("CPU", "CUDA") if overload.has_kernel_for_dispatch_key(key))


OP_KERNELS = {op: _registered(op) for op in _OPS}


def _dispatch(op: str, device: torch.device, kernel: Callable[[], T], reference: Callable[[], T]) -> T:
    """The one dispatch of every op: its compiled kernel where one serves ``device`` (registered, and on a GPU
    a binary image that GPU runs), else ``reference`` after the one warning of that op and device type."""
    device_type = device.type
    if device_type in OP_KERNELS[op] and (device_type != "cuda" or _cuda_kernel_usable(device)):
        return kernel()
    if device_type != "cuda" or device_type not in OP_KERNELS[op]:  # (an unusable GPU warned in _cuda_kernel_usable)
        _warn_once(f"{op}:{device_type}", no_kernel_warning(device_type, op))
    return reference()


def format_readiness_op(
    tensors: list[torch.Tensor], recipes: list[int], tensor_amax: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs format_readiness on tensors of one device (checked here); the float64 reference of
    core/references/format_readiness.py, with one warning, where no compiled kernel serves the device."""
    if not tensors:  # an empty Tensor[] gives the dispatcher no key to pick a kernel by
        return new_readiness_outputs(0, len(recipes), torch.device("cpu"))
    check_one_device(tensors, tensor_amax=tensor_amax)

    def reference() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from amp_inspect.core.references.format_readiness import format_readiness_reference

        return format_readiness_reference(tensors, recipes, tensor_amax)

    return _dispatch(
        "format_readiness",
        tensors[0].device,
        lambda: torch.ops.amp_inspect.format_readiness(tensors, recipes, tensor_amax),
        reference,
    )


def update_stats_op(
    before: list[torch.Tensor], after: list[torch.Tensor], grads: list[torch.Tensor], exp_avg_sq: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs update_stats on checked inputs (update_stats.py); the pure-torch reference of
    core/references/update_stats.py, with one warning, where no compiled kernel serves the device."""
    if not before:  # an empty Tensor[] gives the dispatcher no key to pick a kernel by
        return new_update_outputs(0, torch.device("cpu"), filled=True)
    check_one_device([*before, *after, *grads, *exp_avg_sq])

    def reference() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from amp_inspect.core.references.update_stats import update_stats_reference

        return update_stats_reference(before, after, grads, exp_avg_sq)

    return _dispatch(
        "update_stats",
        before[0].device,
        lambda: torch.ops.amp_inspect.update_stats(before, after, grads, exp_avg_sq),
        reference,
    )


def refuse_nested(op: str, label: str, tensor: torch.Tensor) -> None:
    """The one refusal of a nested tensor, the same sentence from every op (``label``: how the op names the tensor,
    e.g. "tensor 1", "grads[0]"). A strided nested tensor claims torch.strided and a jagged one is no other layout's,
    and no op has a nested kernel: without this check the dispatcher's or NestedTensorImpl's own errors surface."""
    if tensor.is_nested:
        raise TypeError(f"amp_inspect.{op}: {label} is a nested tensor; pass its components instead (list(t.unbind()))")


def check_one_device(tensors: list[torch.Tensor], **others: torch.Tensor | None) -> None:
    """The op's inputs must be real tensors on one device. The dispatcher picks a kernel from all of them
    together, so a meta tensor among CPU ones (or a meta scale) would run the fake kernel, which returns
    uninitialised numbers and writes nothing: refuse that, naming the tensors. (Under torch.compile the
    inputs are fake tensors of their real device: nothing to check.)"""
    if torch.compiler.is_compiling():
        return
    named = [(f"tensor {i}", t) for i, t in enumerate(tensors)]
    named += [(name, t) for name, t in others.items() if t is not None]
    meta = [name for name, t in named if t.device.type == "meta"]
    if meta:
        raise ValueError(
            f"amp_inspect: {', '.join(meta[:8])} {'is' if len(meta) == 1 else 'are'} on the meta device, which holds "
            "no values to inspect (materialise the tensors first, e.g. with to_empty() and an initialisation)"
        )
    devices: dict[torch.device, list[str]] = {}
    for name, t in named:
        devices.setdefault(t.device, []).append(name)
    if len(devices) > 1:
        where = "; ".join(f"{', '.join(names[:4])} on {device}" for device, names in devices.items())
        raise ValueError(f"amp_inspect: the op's tensors must be on one device, got {where}")


def tensor_stats_op(
    tensors: list[torch.Tensor],
    scale: torch.Tensor | None,
    scale_value: float | None,
    formats: list[str],
) -> tuple[torch.Tensor, ...]:
    """Runs the op on tensors of one device (checked by the caller); the reference where no kernel exists."""
    if not tensors:
        return tensor_stats_reference(tensors, scale, scale_value, formats)
    check_one_device(tensors, scale=scale)
    return _dispatch(
        "tensor_stats",
        tensors[0].device,
        lambda: torch.ops.amp_inspect.tensor_stats(tensors, scale, scale_value, formats),
        lambda: tensor_stats_reference(tensors, scale, scale_value, formats),
    )


def unscale_stats_op(
    tensors: list[torch.Tensor], inv_scale: torch.Tensor, found_inf: torch.Tensor, formats: list[str]
) -> tuple[torch.Tensor, ...]:
    """Statistics of ``tensors`` as stored, then ``tensors *= inv_scale`` in place and ``found_inf`` set to 1
    where any value is NaN/Inf; tensors of one device (checked by the caller). Without the compiled kernel:
    the reference statistics, then torch's own unscale (two passes, same results)."""
    if not tensors:
        return tensor_stats_reference(tensors, None, None, formats)
    check_one_device(tensors, inv_scale=inv_scale, found_inf=found_inf)

    def reference() -> tuple[torch.Tensor, ...]:
        stats = tensor_stats_reference(tensors, None, None, formats)
        non_finite_check_and_unscale_(tensors, found_inf, inv_scale)
        return stats

    return _dispatch(
        "tensor_stats",  # the same kernel, the same warning
        tensors[0].device,
        lambda: torch.ops.amp_inspect.unscale_stats_(tensors, inv_scale, found_inf, formats),
        reference,
    )


def built_images() -> list[str]:
    """The GPU images in the binary, e.g. ["sm_80", ..., "compute_120"]; [] without CUDA kernels."""
    built = build_info()
    if built.get("cuda") != "1":
        return []
    return built.get("cuda_archs", "").replace(";", " ").split()


def covers(images: list[str], capability: tuple[int, int]) -> bool:
    """Whether a GPU of compute capability (major, minor) can run one of ``images``: a cubin of the same
    major and a minor not above its own, or PTX of a capability not above its own."""
    major, minor = capability
    for image in images:
        kind, _, number = image.partition("_")
        if not number.isdigit():
            continue
        image_major, image_minor = divmod(int(number), 10)
        if kind == "sm" and image_major == major and image_minor <= minor:
            return True
        if kind == "compute" and (image_major, image_minor) <= (major, minor):
            return True
    return False
