"""The AMP doctor: checks a mixed-precision setup, a run's history and the environment, and says how to fix
what it finds.

    report = doctor(model, optimizer, scaler, autocast_dtype=torch.float16, history=insp.history)
    print(report)              # errors first, each with its fix
    if not report.ok: ...

Severities: an **error** is training that is wrong or silently degraded (fp16 weights stepped without fp32
master copies, fp16 autocast without a GradScaler, clipping gradients that are still scaled); a **warning** works
but wastes or risks something (sizes that keep tensor cores idle, a loss-scale collapse); an **info** is worth
knowing and may need nothing. ``report.ok``: no error and no warning.

Clipping scaled gradients can only be seen while it happens: ``watch_clipping(scaler)`` wraps
``torch.nn.utils.clip_grad_norm_`` and ``clip_grad_value_`` until closed, and ``doctor(..., clip_watch=watch)``
reports what it saw.

Adding a check: a function that takes a ``Setup`` and yields ``Finding``s, decorated with ``@check`` (model,
optimizer, scaler, history) or ``@environment_check`` (the machine and the build).

Cost: the setup checks walk parameters and modules once, reading no tensor data (no sync). Reading a
ClipWatch's findings reads the loss scales it recorded (one host sync on CUDA). The environment checks
initialise CUDA and NVML: they are for ``amp-inspect doctor``, not for the training loop.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import textwrap
import types
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.amp.grad_scaler import OptState

from . import _ops, hardware
from .argtypes import count as count_arg
from .history import StepRecord, collapse_warning, longest_skip_run, summarize
from .naming import clean_module_names, param_entries
from .runlog import read_log

SEVERITIES = ("error", "warning", "info")
TENSOR_CORE_MULTIPLE = 8  # fp16/bf16 GEMMs use tensor cores fully when every dimension is a multiple of this
IMAGE_CHANNELS_MAX = 4  # a Conv's in_channels up to this are image inputs (RGB, RGBA); cuDNN pads them itself
MAX_HEADROOM = 1024  # doublings: float64's exponent range; a larger headroom in a log is not one
MAX_LISTED = 10  # modules or parameters named in one finding before "and N more"
DEFAULT_COLLAPSE_SKIPS = 5
_WRAP_WIDTH = 110


@dataclass(frozen=True)
class Finding:
    """One problem (or fact): ``code`` a short stable id, ``severity`` one of SEVERITIES, ``message`` what is
    wrong and where (parameter and module names), ``fix`` how to fix it, with code."""

    code: str
    severity: str
    message: str
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity must be one of {SEVERITIES}, got {self.severity!r}")

    def __str__(self) -> str:
        head = textwrap.fill(
            f"{self.severity.upper()} [{self.code}] {self.message}",
            _WRAP_WIDTH,
            subsequent_indent="    ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        if not self.fix:
            return head
        fix = textwrap.fill(
            f"fix: {self.fix}",
            _WRAP_WIDTH,
            initial_indent="    ",
            subsequent_indent="         ",
            break_long_words=False,
        )
        return f"{head}\n{fix}"


@dataclass
class DoctorReport:
    """The findings of one doctor run, errors first. ``ok``: no error and no warning."""

    findings: list[Finding] = field(default_factory=list)
    header: list[str] = field(default_factory=list)  # context lines printed first (what was checked)

    def __post_init__(self) -> None:
        self.findings = sorted(self.findings, key=lambda f: SEVERITIES.index(f.severity))  # stable within a level

    @property
    def ok(self) -> bool:
        return not any(f.severity in ("error", "warning") for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def codes(self) -> list[str]:
        return [f.code for f in self.findings]

    def __str__(self) -> str:
        counts = Counter(f.severity for f in self.findings)
        parts = [f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}" for s in ("error", "warning") if counts[s]]
        verdict = ", ".join(parts) if parts else "no problems found"
        lines = [
            *self.header,
            f"amp_inspect doctor: {verdict}" + (f" ({counts['info']} notes)" if counts["info"] else ""),
        ]
        lines += [str(f) for f in self.findings]
        return "\n".join(lines)


# ---- what the checks see ----


@dataclass
class Setup:
    """What the checks look at; any part may be None. ``history``: Inspector.history or a log's StepRecords."""

    model: nn.Module | None = None
    optimizer: torch.optim.Optimizer | None = None
    scaler: torch.amp.GradScaler | None = None
    autocast_dtype: torch.dtype | None = None
    history: Sequence[StepRecord] | None = None
    clip_watch: ClipWatch | None = None
    collapse_skips: int = DEFAULT_COLLAPSE_SKIPS

    @functools.cached_property
    def _param_names(self) -> dict[int, str]:
        if self.model is None:
            return {}
        return {id(e.param): e.name for e in param_entries(self.model)}  # wrappers (DDP, peft) looked through

    def param_name(self, param: torch.Tensor, fallback: str) -> str:
        return self._param_names.get(id(param), fallback)

    def stepped_params(self) -> list[tuple[str, torch.Tensor]]:
        """(name, parameter) of what gets updated: the optimizer's parameters, else the model's trainable ones."""
        if self.optimizer is not None:
            return [
                (self.param_name(p, f"param_groups[{g}].params[{i}]"), p)
                for g, group in enumerate(self.optimizer.param_groups)
                for i, p in enumerate(group["params"])
                if p.requires_grad
            ]
        if self.model is None:
            return []
        return [(e.name, e.param) for e in param_entries(self.model) if e.param.requires_grad]

    @property
    def scaler_enabled(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()


CheckFn = Callable[[Setup], Iterable[Finding]]
CHECKS: list[CheckFn] = []
ENVIRONMENT_CHECKS: list[Callable[[], Iterable[Finding]]] = []


def check(fn: CheckFn) -> CheckFn:
    """Registers a setup check (runs in registration order)."""
    CHECKS.append(fn)
    return fn


def environment_check(fn: Callable[[], Iterable[Finding]]) -> Callable[[], Iterable[Finding]]:
    """Registers an environment check (runs in registration order)."""
    ENVIRONMENT_CHECKS.append(fn)
    return fn


def _listing(names: Sequence[str], limit: int = MAX_LISTED) -> str:
    shown = ", ".join(names[:limit])
    return shown if len(names) <= limit else f"{shown} and {len(names) - limit} more"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ---- setup checks ----


@check
def half_weights(setup: Setup) -> Iterator[Finding]:
    """fp16 (error) or bf16 (info) parameters that the optimizer updates directly, with no fp32 master copy."""
    stepped = setup.stepped_params()
    how = "that the optimizer steps directly" if setup.optimizer is not None else "trainable (requires_grad)"
    for dtype, code in ((torch.float16, "fp16-weights"), (torch.bfloat16, "bf16-weights")):
        names = [name for name, p in stepped if p.dtype == dtype]
        if not names:
            continue
        device = next(p.device.type for _, p in stepped if p.dtype == dtype)
        head = f"{_plural(len(names), 'parameter')} in {str(dtype).removeprefix('torch.')} {how}: {_listing(names)}."
        if dtype == torch.float16:
            yield Finding(
                code,
                "error",
                f"{head} With no fp32 master weights, updates smaller than about 1/2048 of a weight round away, "
                "and GradScaler refuses to unscale fp16 gradients ('Attempting to unscale FP16 gradients.').",
                "keep the weights in float32 (no model.half(); model.float()) and cast per op instead: "
                f"`with torch.autocast('{device}', dtype=torch.float16): loss = model(x)`. If the weights must "
                "stay fp16, let the optimizer step fp32 master copies and copy them back after each step.",
            )
        else:
            yield Finding(
                code,
                "info",
                f"{head} bf16 keeps 8 significant bits, so updates smaller than about 1/256 of a weight round away "
                "unless the optimizer keeps fp32 master weights or compensates (Kahan summation, stochastic "
                "rounding).",
                f"keep the weights in float32 and use `torch.autocast('{device}', dtype=torch.bfloat16)`, or an "
                "optimizer that keeps fp32 master weights.",
            )


@check
def scaler_missing(setup: Setup) -> Iterator[Finding]:
    """fp16 autocast without an enabled GradScaler."""
    if setup.autocast_dtype != torch.float16 or setup.scaler_enabled:
        return
    if setup.scaler is None:
        state = "no GradScaler was given"
    else:
        state = (
            "the GradScaler is disabled (enabled=False, or GradScaler('cuda') turned itself off because CUDA "
            "is not available)"
        )
    device = getattr(setup.scaler, "_device", None) or next((p.device.type for _, p in setup.stepped_params()), "cuda")
    yield Finding(
        "no-grad-scaler",
        "error",
        f"autocast runs in float16 but {state}: gradients in the fp16 backward below 2^-24 (6e-8) flush to zero, "
        "and nothing skips the steps whose gradients overflow to Inf.",
        f"`scaler = torch.amp.GradScaler('{device}')` (or amp_inspect.InspectingGradScaler, which inspects in the "
        "same pass), then `scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()`. On GPUs with "
        "bf16 (compute capability 8.0+), dtype=torch.bfloat16 needs no scaler.",
    )


@check
def scaler_with_bf16(setup: Setup) -> Iterator[Finding]:
    """An enabled GradScaler under bf16 autocast: harmless, but it buys nothing."""
    if setup.autocast_dtype != torch.bfloat16 or not setup.scaler_enabled:
        return
    yield Finding(
        "scaler-with-bf16",
        "info",
        "a GradScaler is enabled with bfloat16 autocast: bf16 has float32's exponent range, so scaling saves no "
        "gradient from underflow; it costs a pass over the gradients each step and skips any step in which a "
        "scaled gradient overflows, for nothing.",
        "drop the scaler: `loss.backward(); optimizer.step()` (or GradScaler(enabled=False) to keep the code "
        "path). amp_inspect inspects without one: `insp = attach(model)` and `insp.check()` after backward.",
    )


@check
def clipping_scaled_gradients(setup: Setup) -> Iterator[Finding]:
    """Clipping while the gradients are still scaled, as a ClipWatch saw it (reading it syncs once on CUDA)."""
    if setup.clip_watch is not None:
        yield from setup.clip_watch.findings


def _is_hf_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (checked without importing transformers: a model holding one imported it)."""
    pytorch_utils = sys.modules.get("transformers.pytorch_utils")
    conv1d = getattr(pytorch_utils, "Conv1D", None)
    if conv1d is not None and isinstance(module, conv1d):
        return True
    # The same layer copied elsewhere (older transformers, nanoGPT ports): named Conv1D with int nx / nf.
    return type(module).__name__ == "Conv1D" and all(isinstance(getattr(module, a, None), int) for a in ("nx", "nf"))


def _odd_dims(module: nn.Module) -> list[tuple[str, int]]:
    """The GEMM dimensions of a Linear (transformers' Conv1D too), Conv or Embedding that are not multiples of
    TENSOR_CORE_MULTIPLE.

    Grouped convolutions (groups > 1) are not plain GEMMs and are left out; so are a Conv's image-input channels
    (in_channels <= IMAGE_CHANNELS_MAX, which cuDNN pads) and sizes of 0 (lazy modules not yet initialised)."""
    if isinstance(module, nn.Linear):
        dims = [("in_features", module.in_features), ("out_features", module.out_features)]
    elif isinstance(module, nn.modules.conv._ConvNd):
        if module.groups > 1:
            return []
        dims = [("out_channels", module.out_channels)]
        if module.in_channels > IMAGE_CHANNELS_MAX:
            dims.insert(0, ("in_channels", module.in_channels))
    elif isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
        dims = [("num_embeddings", module.num_embeddings), ("embedding_dim", module.embedding_dim)]
    elif _is_hf_conv1d(module):  # transformers' Conv1D: GPT-2's c_attn / c_proj / c_fc, a Linear with weight [nx, nf]
        dims = [("nx", module.nx), ("nf", module.nf)]
    else:
        return []
    return [(name, size) for name, size in dims if size > 0 and size % TENSOR_CORE_MULTIPLE]


@check
def tensor_core_sizes(setup: Setup) -> Iterator[Finding]:
    """Linear / Conv / Embedding sizes that are not multiples of 8, grouped into one finding."""
    if setup.model is None or setup.autocast_dtype == torch.float32:
        return
    entries, example = [], None
    for module, name in clean_module_names(setup.model):  # as the user wrote them: wrappers looked through
        dims = _odd_dims(module)
        if dims:
            sizes = ", ".join(f"{k}={v}" for k, v in dims)
            entries.append(f"{name or '(root)'} ({type(module).__name__} {sizes})")
            example = example or max(v for _, v in dims)
    if not entries:
        return
    padded = -(-example // TENSOR_CORE_MULTIPLE) * TENSOR_CORE_MULTIPLE
    yield Finding(
        "tensor-core-sizes",
        "warning",
        f"{_plural(len(entries), 'module')} with sizes that are not multiples of {TENSOR_CORE_MULTIPLE}, so their "
        f"fp16/bf16 GEMMs cannot use tensor cores fully: {_listing(entries)}.",
        f"pad those sizes up to a multiple of {TENSOR_CORE_MULTIPLE} (e.g. {example} -> {padded}); for a "
        "vocabulary, pad the Embedding and the output Linear and mask or ignore the extra logits.",
    )


@check
def loss_scale_collapse(setup: Setup) -> Iterator[Finding]:
    """A collapse of the loss scale at the end of the history (scale below 1, or collapse_skips skipped steps in a
    row), or a burst of as many skips in a row mid-run that recovered. A run of skips at the very start that
    recovered is GradScaler calibrating a too-high init_scale: scaler_advice and init_scale_too_high cover it."""
    history = list(setup.history or [])
    if not history:
        return
    message = collapse_warning(history, setup.collapse_skips)
    if message is not None:
        yield Finding(
            "scale-collapse",
            "warning",
            f"{message}. Skipped steps in a row mean the gradients are non-finite at every scale tried: the NaN/Inf "
            "come from the forward or backward itself (an overflowing activation, log(0), a division by zero), not "
            "from the loss scale.",
            "find the first module that produces them with `attach(model, scaler, activations='always')` (its "
            "report names first_nonfinite); run that op in float32 (`with torch.autocast(device, enabled=False):` "
            "around it, inputs cast with .float()), or train in bfloat16.",
        )
        return
    run, end = longest_skip_run(history)
    start = end - run + 1
    if run < setup.collapse_skips or start == 0:
        return
    culprits = Counter(m for r in history[start : end + 1] for m in r.offenders)
    named = ", ".join(m for m, _ in culprits.most_common(3)) or "no module (no NaN/Inf in gradients)"
    before, after = history[start].scale, history[end + 1].scale if end + 1 < len(history) else None
    fall = f", the scale falling from {before:g} to {after:g}" if before and after else ""
    yield Finding(
        "skip-burst",
        "warning",
        f"{run} skipped steps in a row mid-run, ending at step {history[end].step}{fall} before steps went through "
        f"again; offenders: {named}. A gradient spike that only a much smaller scale absorbed, or non-finite "
        "values that went away on their own.",
        "look at what those steps had in common (a batch, a learning-rate change); if it recurs, "
        "`attach(model, scaler, activations='always')` names the first module going non-finite. A smaller "
        "backoff_factor (e.g. 0.25) skips fewer steps per burst.",
    )


@check
def scaler_advice(setup: Setup) -> Iterator[Finding]:
    """GradScaler settings advice from the history (amp_inspect.history.summarize)."""
    history = list(setup.history or [])
    if not history:
        return
    kwargs: dict[str, Any] = {}
    if setup.scaler_enabled:
        scaler = setup.scaler
        kwargs = {
            "init_scale": getattr(scaler, "_init_scale", None),
            "growth_interval": scaler.get_growth_interval(),
            "backoff_factor": scaler.get_backoff_factor(),
        }
    for advice in summarize(history, collapse_skips=setup.collapse_skips, **kwargs).advice:
        seen, _, action = advice.rpartition(": ")
        yield Finding("scaler-advice", "info", seen or action, action if seen else "")


def _usable_scale(scale: Any) -> bool:
    """A loss scale worth computing with: positive and finite (a log from elsewhere may hold anything)."""
    return isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0


@check
def init_scale_too_high(setup: Setup) -> Iterator[Finding]:
    """init_scale above the largest scale at which the recent gradients still fit the format (the first steps
    of a new run would be skipped while it backs off)."""
    history = list(setup.history or [])
    if not history:
        return
    init = getattr(setup.scaler, "_init_scale", None) if setup.scaler_enabled else history[0].scale
    if not _usable_scale(init):
        return
    recent = history[-10:]
    ceilings = [
        r.scale * 2.0**r.headroom.up
        for r in recent
        if _usable_scale(r.scale) and r.headroom.up is not None and abs(r.headroom.up) < MAX_HEADROOM
    ]
    recommended = sorted(r.recommended_scale for r in recent if _usable_scale(r.recommended_scale))
    if not ceilings or not recommended or init <= min(ceilings):
        return
    target = round(math.log2(recommended[len(recommended) // 2]))
    skips = math.ceil(math.log2(init / min(ceilings)))
    yield Finding(
        "init-scale-high",
        "info",
        f"init_scale {init:g} is above 2^{math.floor(math.log2(min(ceilings)))}, the largest scale at which "
        f"recent gradients fit: a run starting at it skips about {_plural(skips, 'step')} while the scale backs "
        f"off; recent steps recommend 2^{target}.",
        f"`torch.amp.GradScaler(..., init_scale=2.0**{target})`.",
    )


@check
def fused_optimizer_device(setup: Setup) -> Iterator[Finding]:
    """fused=True with a GradScaler on parameters of a device type torch has no fused kernels for."""
    optimizer = setup.optimizer
    if optimizer is None or not setup.scaler_enabled:
        return
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        supported = set(_get_fused_kernels_supported_devices())
    except ImportError:  # a private helper: when it moves, skip the check rather than guess
        return
    bad = sorted({p.device.type for g in optimizer.param_groups if g.get("fused") for p in g["params"]} - supported)
    if bad:
        yield Finding(
            "fused-optimizer-device",
            "error",
            f"{type(optimizer).__name__}(fused=True) steps parameters on {', '.join(bad)}, where torch has no fused "
            f"kernels (it has them for {', '.join(sorted(supported))}); the fused step that unscales inside the "
            "optimizer cannot run there.",
            f"construct the optimizer with `foreach=True` instead of fused=True, e.g. "
            f"`torch.optim.{type(optimizer).__name__}(params, foreach=True)`.",
        )


# ---- environment checks ----


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
            f"no GPU visible{build}: CUDA autocast and GradScaler('cuda') cannot run here; CPU autocast runs bf16.",
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


def _arch_covers(archs: str, cap: tuple[int, int]) -> bool:
    """Whether a build for ``archs`` (TORCH_CUDA_ARCH_LIST style: "8.0;9.0", "8.6+PTX", "9.0a") runs on ``cap``:
    a binary runs on its major version at an equal or higher minor one; PTX is compiled for any later GPU."""
    for arch in archs.replace(" ", ";").split(";"):
        ptx = arch.endswith("+PTX")
        digits = arch.removesuffix("+PTX").rstrip("af")
        try:
            major, minor = (int(x) for x in digits.split("."))
        except ValueError:
            return True  # a list we cannot read: do not claim the GPU is missing from it
        if (major == cap[0] and minor <= cap[1]) or (ptx and (major, minor) <= cap):
            return True
    return False


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
    if gpus_found and not _ops.has_kernel("cuda"):
        yield Finding(
            "no-cuda-kernel",
            "warning",
            "a GPU is visible but the compiled extension has no CUDA kernel (built without nvcc or a CUDA torch): "
            "GPU tensors go through the slower pure-torch reference.",
            "install the CUDA toolkit matching torch.version.cuda and " + rebuild,
        )
    archs = built.get("cuda_archs", "")
    missing = sorted({f"{n} ({c[0]}.{c[1]})" for n, c in gpus_found if archs and not _arch_covers(archs, c)})
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
    return [finding for fn in ENVIRONMENT_CHECKS for finding in fn()]


# ---- the doctor ----


def _autocast_in_effect() -> torch.dtype | None:
    """The dtype of the autocast region the caller is in (CUDA first, then CPU), or None outside one."""
    for device_type in ("cuda", "cpu"):
        try:
            if torch.is_autocast_enabled(device_type):
                return torch.get_autocast_dtype(device_type)
        except (TypeError, RuntimeError):  # older torch without the device_type argument
            continue
    return None


_DTYPE_NAMES = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16}
_DTYPE_NAMES |= {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


def doctor(
    model: nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scaler: torch.amp.GradScaler | None = None,
    *,
    autocast_dtype: torch.dtype | str | None = None,
    history: Sequence[StepRecord] | Any | None = None,
    clip_watch: ClipWatch | None = None,
    collapse_skips: int = DEFAULT_COLLAPSE_SKIPS,
    environment: bool = False,
) -> DoctorReport:
    """Runs every registered check on this setup; see the module docstring.

    Args:
        autocast_dtype: the dtype of the training's autocast region (torch.float16, torch.bfloat16 or "fp16",
            "bf16"); None: the autocast region doctor() is called in, if any.
        history: ``Inspector.history`` (or an Inspector), or StepRecords read from a run log.
        clip_watch: a ``watch_clipping`` handle that was open during training steps.
        environment: also run the environment checks (initialises CUDA and NVML).

    Cost: walks parameters and modules once; no sync, except reading clip_watch's recorded scales (one).
    """
    if isinstance(autocast_dtype, str):
        if autocast_dtype.lower() not in _DTYPE_NAMES:
            raise ValueError(f"autocast_dtype {autocast_dtype!r}: use one of {sorted(_DTYPE_NAMES)}")
        autocast_dtype = _DTYPE_NAMES[autocast_dtype.lower()]
    if autocast_dtype is None:
        autocast_dtype = _autocast_in_effect()
    if history is not None and not isinstance(history, Sequence):
        history = history.history  # an Inspector
    setup = Setup(model, optimizer, scaler, autocast_dtype, history, clip_watch, collapse_skips)
    findings = [finding for fn in CHECKS for finding in fn(setup)]
    if environment:
        findings += check_environment()
    return DoctorReport(findings)


# ---- clipping scaled gradients ----

CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_")


def _clip_modules() -> tuple[types.ModuleType, ...]:
    import torch.nn.utils
    import torch.nn.utils.clip_grad

    return (torch.nn.utils, torch.nn.utils.clip_grad)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # with the separator: not torchvision


def _call_site() -> str:
    """file:line of the first caller outside this module and torch (a few frame hops; no I/O)."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__ or frame.f_code.co_filename.startswith(_TORCH_DIR)
    ):
        frame = frame.f_back
    if frame is None:
        return "<unknown>"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@dataclass
class _ClipSite:
    function: str
    where: str
    calls: int
    scale: torch.Tensor  # a copy of the loss scale at the last call
    not_one: torch.Tensor  # bool tensor: some call saw a scale other than 1


class ClipWatch:
    """Watches ``torch.nn.utils.clip_grad_norm_`` / ``clip_grad_value_`` for calls on gradients still scaled by
    ``scaler``: after ``scaler.scale(loss)``, before ``scaler.unscale_(optimizer)``. Use ``watch_clipping``.

    The gradients count as scaled when the scaler is enabled, has scaled a loss, and the optimizer that owns the
    clipped parameters is still in GradScaler's READY stage (neither unscale_ nor step ran since update). Pass
    ``optimizers`` to tell owners apart; without it, any optimizer already unscaled this step clears the call.
    GradScaler's state does not tell "after update()" from "after the next scale(loss)", so a clip between
    update() and the next backward counts too (it acts on the last step's spent gradients: nobody clips there).

    Calls made through a name bound before the watch started (``from torch.nn.utils import clip_grad_norm_`` at
    import time) are not seen: the watch replaces the functions in torch.nn.utils and torch.nn.utils.clip_grad.

    Cost per watched call: a look at the scaler's state, one frame walk and a copy of the scale tensor (async,
    no sync). ``findings`` reads the recorded scales (one sync on CUDA). ``close()`` puts the originals back; it
    runs on leaving a ``with`` block, exception or not, and is safe to call twice.
    """

    def __init__(
        self,
        scaler: torch.amp.GradScaler,
        optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
    ) -> None:
        if not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"watch_clipping needs a torch.amp.GradScaler, got {type(scaler).__name__}")
        self.scaler = scaler
        if isinstance(optimizers, torch.optim.Optimizer):
            optimizers = [optimizers]
        self.optimizers: list[torch.optim.Optimizer] = list(optimizers or [])
        self.closed = False
        self._sites: dict[tuple[str, str], _ClipSite] = {}
        self._patches: list[tuple[types.ModuleType, str, Callable, Callable]] = []
        self._warned = False
        try:
            self._install()
        except BaseException:
            self.close()
            raise

    def _install(self) -> None:
        wrappers: dict[int, Callable] = {}  # one wrapper per function object (both modules hold the same one)
        for module in _clip_modules():
            for name in CLIP_FUNCTIONS:
                original = getattr(module, name)
                wrapper = wrappers.get(id(original))
                if wrapper is None:
                    wrapper = wrappers[id(original)] = self._wrap(name, original)
                setattr(module, name, wrapper)
                self._patches.append((module, name, original, wrapper))

    def _wrap(self, name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def watched(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.closed:
                parameters = self._observe(name, parameters)
            return original(parameters, *args, **kwargs)

        watched._amp_inspect_clip_watch = self  # type: ignore[attr-defined]
        return watched

    def _observe(self, name: str, parameters: Any) -> Any:
        """Records the call when the gradients are scaled; returns ``parameters`` ready to pass on (an iterator
        is read once here, so the original gets a fresh one over the same parameters)."""
        if isinstance(parameters, torch.Tensor):
            params, passed = [parameters], parameters
        else:
            params = list(parameters)
            if isinstance(parameters, types.GeneratorType):
                passed = (p for p in params)  # keeps torch's empty-generator warning
            elif isinstance(parameters, Iterator):
                passed = params
            else:
                passed = parameters
        try:
            if self._grads_scaled(params):
                self._record(name)
        except Exception as error:  # a watch must never break the training step it watches
            if not self._warned:
                self._warned = True
                warnings.warn(f"amp_inspect: watch_clipping could not inspect a call ({error!r})", stacklevel=3)
        return passed

    def _grads_scaled(self, params: list[torch.Tensor]) -> bool:
        scaler = self.scaler
        if not scaler.is_enabled() or getattr(scaler, "_scale", None) is None:
            return False  # no loss was ever scaled
        states = scaler._per_optimizer_states  # .get below: reading must not add entries to the defaultdict

        def ready(optimizer_id: int) -> bool:
            state = states.get(optimizer_id)
            return state is None or state["stage"] is OptState.READY

        if self.optimizers:
            clipped = {id(p) for p in params}
            owners = [
                opt
                for opt in self.optimizers
                if any(id(p) in clipped for group in opt.param_groups for p in group["params"])
            ]
            return any(ready(id(opt)) for opt in owners or self.optimizers)
        return all(ready(key) for key in states)

    def _record(self, name: str) -> None:
        where = _call_site()
        scale = self.scaler._scale.detach().clone()  # async; update() changes the scale tensor in place
        site = self._sites.get((name, where))
        if site is None:
            self._sites[(name, where)] = _ClipSite(name, where, 1, scale, scale != 1)
        else:
            site.calls += 1
            site.scale = scale
            site.not_one = site.not_one | (scale != 1)

    @property
    def calls(self) -> int:
        """Watched calls made on scaled gradients so far (any scale)."""
        return sum(site.calls for site in self._sites.values())

    @property
    def findings(self) -> list[Finding]:
        """One error per call site that clipped scaled gradients at a scale other than 1 (syncs once on CUDA)."""
        out = []
        for site in self._sites.values():
            if not bool(site.not_one):
                continue
            scale = float(site.scale)
            if site.function == "clip_grad_norm_":
                effect = (
                    f"the norm it measures (and returns) is {scale:g} times the true one, so it clips to max_norm/"
                    f"{scale:g} in true units and shrinks the updates up to {scale:g}-fold"
                )
            else:
                effect = f"it clips at clip_value/{scale:g} in true units, flattening nearly every gradient"
            out.append(
                Finding(
                    "clip-before-unscale",
                    "error",
                    f"torch.nn.utils.{site.function} ran on gradients still scaled by the loss scale ({scale:g}) at "
                    f"{site.where} ({_plural(site.calls, 'call')}), before scaler.unscale_(optimizer): {effect}.",
                    "unscale first: `scaler.scale(loss).backward(); scaler.unscale_(optimizer); "
                    f"torch.nn.utils.{site.function}(model.parameters(), ...); scaler.step(optimizer); "
                    "scaler.update()` (step() does not unscale twice).",
                )
            )
        return out

    def close(self) -> None:
        """Puts the original functions back (those this watch replaced and nobody replaced since). Idempotent."""
        self.closed = True
        for module, name, original, wrapper in reversed(self._patches):
            if getattr(module, name, None) is not wrapper:
                continue  # replaced again since (another watch): that one restores, and ours passes through
            while getattr(getattr(original, "_amp_inspect_clip_watch", None), "closed", False):
                original = original.__wrapped__  # an older watch closed meanwhile: skip its wrapper
            setattr(module, name, original)
        self._patches.clear()

    def __enter__(self) -> ClipWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"ClipWatch({type(self.scaler).__name__}, {_plural(self.calls, 'call')} on scaled gradients) [{state}]"


def watch_clipping(
    scaler: torch.amp.GradScaler,
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None,
) -> ClipWatch:
    """Starts watching torch's gradient clipping for calls on gradients still scaled by ``scaler``.

        with watch_clipping(scaler, optimizer) as watch:
            train_a_few_steps()
        print(doctor(model, optimizer, scaler, clip_watch=watch))

    Or keep the handle and ``watch.close()`` when done. See ClipWatch for what counts and what it costs."""
    return ClipWatch(scaler, optimizers)


# ---- the command ----

GPU_MEMORY_FULL = 0.95  # share of a GPU's memory in use (NVML) from which the doctor warns of out-of-memory risk
_GIB = float(1 << 30)


def log_hardware_findings(records: Sequence[dict[str, Any]]) -> list[Finding]:
    """Peaks of the ``"hardware"`` readings of a run log's records (amp_inspect.hardware keys), their
    ``"hardware_note"``s, and a warning when the GPU's memory came close to full."""
    findings = [
        Finding("hardware-note", "info", str(note))
        for note in dict.fromkeys(r["hardware_note"] for r in records if r.get("hardware_note"))
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
        findings.append(Finding("hardware", "info", "peaks over the run: " + ", ".join(parts)))
    full = [
        (used / total, step)
        for step, h in readings
        if (used := reading(h, "gpu_mem_used")) is not None and (total := reading(h, "gpu_mem_total"))
    ]
    if full and max(full)[0] >= GPU_MEMORY_FULL:
        share, step = max(full)
        findings.append(
            Finding(
                "gpu-memory-full",
                "warning",
                f"the GPU's memory was {share:.0%} used at step {step} (NVML, every process included): one larger "
                "batch or sequence away from an out-of-memory error.",
                "lower the batch size or checkpoint activations (torch.utils.checkpoint); if torch_reserved is far "
                "above torch_peak, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` reduces fragmentation.",
            )
        )
    return findings


def _log_report(path: str, collapse_skips: int) -> tuple[list[str], list[Finding]]:
    records = read_log(path)
    history = [StepRecord.from_log_record(r) for r in records if "step" in r]
    skipped = sum(r.skipped for r in history)
    header = [f"run log {path}: {_plural(len(history), 'inspected step')}, {skipped} skipped"]
    if not history:
        return header, [Finding("empty-log", "info", f"{path} holds no step records yet")]
    return header, doctor(history=history, collapse_skips=collapse_skips).findings + log_hardware_findings(records)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the doctor's options to ``parser`` (its own, or the ``doctor`` sub-parser of ``amp-inspect``)."""
    parser.add_argument("--log", metavar="RUN.jsonl", help="a run log written by attach(..., log=...)")
    parser.add_argument(
        "--collapse-skips",
        type=count_arg(1),
        default=DEFAULT_COLLAPSE_SKIPS,
        metavar="N",
        help=f"skipped steps in a row that count as a loss-scale collapse (default {DEFAULT_COLLAPSE_SKIPS})",
    )
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings as well as errors")
    return parser


DESCRIPTION = (
    "Checks this machine for mixed-precision training (torch build, GPUs, TF32, amp_inspect's compiled kernels) "
    "and, with --log, a run's loss-scale history and hardware readings, and says how to fix what it finds."
)


def run(args: argparse.Namespace) -> int:
    """Runs the command on parsed arguments (see ``add_arguments``); prints the report; returns the exit code."""
    header = [f"environment: torch {torch.__version__}, python {sys.version.split()[0]}"]
    findings = check_environment()
    if args.log is not None:
        try:
            log_header, log_findings = _log_report(args.log, args.collapse_skips)
        except (OSError, ValueError) as error:
            print(f"amp-inspect doctor: cannot read {args.log}: {error}", file=sys.stderr)
            return 2
        header += log_header
        findings += log_findings
    report = DoctorReport(findings, header)
    print(report)
    failing = report.errors or (args.strict and report.warnings)
    return 1 if failing else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``amp-inspect doctor [--log run.jsonl] [--strict]``: environment checks, and the run's history with --log.

    Prints the findings; returns 0 when there is no error (1 otherwise; with --strict, warnings count too),
    2 when the log cannot be read. Initialises CUDA and NVML."""
    parser = add_arguments(argparse.ArgumentParser(prog="amp-inspect doctor", description=DESCRIPTION))
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
