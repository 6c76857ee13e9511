"""The AMP doctor's setup checks: what is wrong with a model, optimizer, GradScaler, autocast dtype and history,
each a function of a ``Setup`` registered with ``@check`` (amp_inspect/diagnosis/findings.py);
amp_inspect/diagnosis/doctor.py runs them.

Cost: the checks walk parameters and modules once, reading no tensor data (no sync). Reading a ClipWatch's
findings reads the loss scales it recorded (one host sync on CUDA).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from amp_inspect.core.advice import Advice
from amp_inspect.core.printable import plural
from amp_inspect.core.torch_compat import init_scale
from amp_inspect.diagnosis.findings import Finding, check, listing
from amp_inspect.diagnosis.history import (
    COLLAPSE_SKIPS,
    StepRecord,
    collapse_warning,
    first_findings,
    longest_skip_run,
    stable_recommended_scale,
    summarize,
    uses_fp16,
    where_started,
)
from amp_inspect.diagnosis.incident import weight_poisoning
from amp_inspect.model.view import ModelView
from amp_inspect.scaling.clipping import ScaledClip
from amp_inspect.scaling.timeline import POLICY_TORCH, policy_of


class ClipEvidence(Protocol):
    """What the clipping check reads from a clip watch (amp_inspect.scaling.clipping.ClipWatch is one): its typed
    evidence, which this check words as a finding."""

    @property
    def scaled_clips(self) -> list[ScaledClip]: ...


TENSOR_CORE_MULTIPLE = 8  # fp16/bf16 GEMMs use tensor cores fully when every dimension is a multiple of this
IMAGE_CHANNELS_MAX = 4  # a Conv's in_channels up to this are image inputs (RGB, RGBA); cuDNN pads them itself
MAX_HEADROOM = 1024  # doublings: float64's exponent range; a larger headroom in a log is not one


@dataclass
class Setup:
    """What the checks look at; any part may be None. ``history``: Inspector.history or a log's StepRecords.
    ``model``: the model or its view (an inspector's: no walk of the module tree; a model is walked once here)."""

    model: nn.Module | ModelView | None = None
    optimizer: torch.optim.Optimizer | None = None
    scaler: torch.amp.GradScaler | None = None
    autocast_dtype: torch.dtype | None = None
    history: Sequence[StepRecord] | None = None
    clip_watch: ClipEvidence | None = None
    collapse_skips: int = COLLAPSE_SKIPS

    def __post_init__(self) -> None:
        self.view: ModelView | None = None if self.model is None else ModelView.of(self.model)
        if self.view is not None:
            self.model = self.view.root

    @functools.cached_property
    def _param_names(self) -> dict[int, str]:
        if self.view is None:
            return {}
        return {id(e.param): e.name for e in self.view.entries}  # wrappers (DDP, peft) looked through

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
        if self.view is None:
            return []
        return [(e.name, e.param) for e in self.view.entries if e.param.requires_grad]

    @property
    def scaler_enabled(self) -> bool:
        return self.scaler is not None and self.scaler.is_enabled()


CheckFn = Callable[[Setup], Iterable[Finding]]  # what ``@check`` registers


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
        head = f"{plural(len(names), 'parameter')} in {str(dtype).removeprefix('torch.')} {how}: {listing(names)}."
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
    # The device of the parameters, which is where their scaler belongs (GradScaler keeps its own privately).
    device = next((p.device.type for _, p in setup.stepped_params()), "cuda")
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
        for clip in setup.clip_watch.scaled_clips:
            yield _clipped_scaled(clip)


def _clipped_scaled(clip: ScaledClip) -> Finding:
    scale = clip.scale
    if clip.function == "clip_grad_norm_":
        effect = (
            f"the norm it measures (and returns) is {scale:g} times the true one, so it clips to max_norm/"
            f"{scale:g} in true units and shrinks the updates up to {scale:g}-fold"
        )
    else:
        effect = f"it clips at clip_value/{scale:g} in true units, flattening nearly every gradient"
    return Finding(
        "clip-before-unscale",
        "error",
        f"torch.nn.utils.{clip.function} ran on gradients still scaled by the loss scale ({scale:g}) at "
        f"{clip.where} ({plural(clip.calls, 'call')}), before scaler.unscale_(optimizer): {effect}.",
        "unscale first: `scaler.scale(loss).backward(); scaler.unscale_(optimizer); "
        f"torch.nn.utils.{clip.function}(model.parameters(), ...); scaler.step(optimizer); "
        "scaler.update()` (step() does not unscale twice).",
    )


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
    if setup.view is None or setup.autocast_dtype == torch.float32:
        return
    entries, example = [], None
    for module, name in setup.view.modules:  # as the user wrote them: wrappers looked through
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
        f"{plural(len(entries), 'module')} with sizes that are not multiples of {TENSOR_CORE_MULTIPLE}, so their "
        f"fp16/bf16 GEMMs cannot use tensor cores fully: {listing(entries)}.",
        f"pad those sizes up to a multiple of {TENSOR_CORE_MULTIPLE} (e.g. {example} -> {padded}); for a "
        "vocabulary, pad the Embedding and the output Linear and mask or ignore the extra logits.",
    )


def _or_bf16(history: Sequence[StepRecord]) -> str:
    """ ", or train in bfloat16" unless the run already autocasts to bf16 (the advice would be no change)."""
    return "" if any(r.autocast == "bf16" for r in history) else ", or train in bfloat16"


def split_advice(advice: str) -> tuple[str, str]:
    """(what the run shows, what to do) of a plain advice line "what the run shows: what to do" (a loss-scale
    policy's own advice may be plain strings; the tool's own lines are ``Advice``, typed), split at the first ": "
    outside parentheses (a "(first: step 8)" is part of what the run shows); ("advice", "") without one."""
    depth = 0
    for i, ch in enumerate(advice):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and advice.startswith(": ", i):
            return advice[:i], advice[i + 2 :]
    return advice, ""


@check
def weights_poisoned(setup: Setup) -> Iterator[Finding]:
    """The weights themselves became NaN/Inf (diagnosis/incident.py): since which step, by which step's optimizer
    step, and where that step's NaN/Inf started; every later step's NaN/Inf follows from them."""
    poisoning = weight_poisoning(list(setup.history or []))
    if poisoning is not None:
        made = () if poisoning.by_step is None else (poisoning.by_step,)
        origin = () if poisoning.origin is None else (poisoning.origin,)
        yield Finding(
            "weights-poisoned",
            "error",
            f"{poisoning.headline()}.",
            f"{poisoning.action()}.",
            steps=(*made, poisoning.since),
            modules=tuple(dict.fromkeys((*origin, *poisoning.first_read.nonfinite))),
            evidence=poisoning.to_json(),
        )


@check
def first_nonfinite_producer(setup: Setup) -> Iterator[Finding]:
    """The activation hooks' first non-finite producers in the history: the module whose output (or output
    gradient) went non-finite first, the answer to "where did the NaN start" (it leads the history's findings)."""
    found = first_findings(list(setup.history or []))
    if not found:
        return
    shown = "; ".join(f"{finding} (on {plural(n, 'step')})" for finding, n in found.most_common(3))
    more = f"; and {plural(len(found) - 3, 'more finding')}" if len(found) > 3 else ""
    yield Finding(
        "first-nonfinite",
        "warning",
        f"the activation hooks found the first non-finite producer: {shown}{more}.",
        "look at that module's op: run it in float32 (`with torch.autocast(device, enabled=False):` around it, "
        f"inputs cast with .float()), check its weights and inputs for large values{_or_bf16(setup.history or [])}.",
    )


def _source_fix(history: Sequence[StepRecord]) -> str:
    """How to find where the NaN/Inf start, from what the history already holds: the hooks' finding when there is
    one (no advice to arm hooks that already answered), else the way to get it."""
    found = first_findings(list(history))
    if found:
        return (
            f"the activation hooks name the first non-finite producer: {found.most_common(1)[0][0]}; run that op in "
            "float32 (`with torch.autocast(device, enabled=False):` around it, inputs cast with .float())"
            f"{_or_bf16(history)}."
        )
    return (
        "find the first module that produces them with `attach(model, scaler, activations='always')` (its "
        "report names first_nonfinite); run that op in float32 (`with torch.autocast(device, enabled=False):` "
        f"around it, inputs cast with .float()){_or_bf16(history)}."
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
        collapse = message.startswith("loss scale collapse")
        code = "scale-collapse" if collapse else "skips-in-a-row"
        yield Finding(
            code,
            "warning",
            f"{message}. Skipped steps in a row mean the gradients are non-finite at every scale tried: the NaN/Inf "
            "come from the forward or backward itself (an overflowing activation, log(0), a division by zero), not "
            "from the loss scale.",
            _source_fix(history),
        )
        return
    run, end = longest_skip_run(history)
    start = end - run + 1
    if run < setup.collapse_skips or start == 0:
        return
    named = where_started(history, start, end, "no module (no NaN/Inf in gradients)")
    before, after = history[start].scale, history[end + 1].scale if end + 1 < len(history) else None
    fall = f", the scale falling from {before:g} to {after:g}" if before and after else ""
    yield Finding(
        "skip-burst",
        "warning",
        f"{run} skipped steps in a row mid-run, ending at step {history[end].step}{fall} before steps went through "
        f"again; the NaN/Inf started in {named}. A gradient spike that only a much smaller scale absorbed, or "
        "non-finite values that went away on their own.",
        "look at what those steps had in common (a batch, a learning-rate change); if it recurs, "
        "`attach(model, scaler, activations='always')` names the first module going non-finite. A smaller "
        "backoff_factor (e.g. 0.25) skips fewer steps per burst.",
    )


def scaler_settings(scaler: torch.amp.GradScaler | None) -> dict[str, Any]:
    """The settings of ``scaler`` the summary's advice is phrased against (history.summarize's keywords); none
    for a missing or disabled scaler."""
    if scaler is None or not scaler.is_enabled():
        return {}
    return {
        "init_scale": init_scale(scaler),
        "growth_interval": scaler.get_growth_interval(),
        "backoff_factor": scaler.get_backoff_factor(),
    }


@check
def scaler_advice(setup: Setup) -> Iterator[Finding]:
    """The history's advice (amp_inspect.diagnosis.history.summarize), each line filed under what it is about: NaN/Inf
    steps that no scaler skipped (``poisoned-steps``, a warning: the weights may be NaN), gradient spikes that no scaler
    skipped (``gradient-spikes``, an info: the values stay finite and one spike is common in a healthy run),
    NaN/Inf from one rank alone (``one-rank-nonfinite``), the optimizer updates' verdicts (updates/report.py:
    ``updates-rounded-away``, ``optimizer-state-underflow``, ``update-ratio``), and loss-scaler settings
    (``scaler-advice``)."""
    history = list(setup.history or [])
    if not history:
        return
    summary = summarize(history, collapse_skips=setup.collapse_skips, **scaler_settings(setup.scaler))
    for advice in summary.advice:
        if not isinstance(advice, Advice):  # a loss-scale policy of one's own may return plain lines
            seen, action = split_advice(advice)
            advice = Advice(seen, action)
        if advice.code == "weights-poisoned":
            continue  # weights_poisoned files it, with its headline
        yield Finding(
            advice.code, advice.severity, advice.seen, advice.action, steps=advice.steps, modules=advice.modules
        )


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
    init = init_scale(setup.scaler) if setup.scaler is not None and setup.scaler_enabled else history[0].scale
    if not _usable_scale(init):
        return
    recent = history[-10:]
    ceilings = [
        r.scale * 2.0**r.headroom.up
        for r in recent
        if _usable_scale(r.scale) and r.headroom.up is not None and abs(r.headroom.up) < MAX_HEADROOM
    ]
    # The same recommendation as the summary's (the median of recent clean steps), and only where GradScaler's own
    # policy sets the scale in an fp16 run: under policy="headroom" the policy's next scale is the one shown.
    stable = stable_recommended_scale(history)
    if policy_of(r.scale_decision for r in history) != POLICY_TORCH or not uses_fp16(history):
        return
    if not ceilings or stable is None or not _usable_scale(stable[0]) or init <= min(ceilings):
        return
    target = round(math.log2(stable[0]))
    skips = math.ceil(math.log2(init / min(ceilings)))
    yield Finding(
        "init-scale-high",
        "info",
        f"init_scale {init:g} is above 2^{math.floor(math.log2(min(ceilings)))}, the largest scale at which "
        f"recent gradients fit: a run starting at it skips about {plural(skips, 'step')} while the scale backs "
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
        from amp_inspect.core.torch_compat import fused_optimizer_devices

        supported = fused_optimizer_devices()
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
