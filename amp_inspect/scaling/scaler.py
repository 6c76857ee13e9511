"""InspectingGradScaler: a drop-in torch.amp.GradScaler whose unscale pass is the inspection.

Where GradScaler runs ``_amp_foreach_non_finite_check_and_unscale_`` over the gradients, this scaler runs
amp_inspect's fused ``unscale_stats_``: one pass that checks for NaN/Inf, gathers the statistics of the
scaled gradients (as fp16 saw them) and writes the unscaled gradients. Skip decisions, scale updates and
state_dict are GradScaler's own, unchanged. It also unscales bf16 gradients on CUDA, which torch's
unscale kernel rejects. With fused optimizers (``fused=True``), which unscale inside their own step, it
inspects without writing. Sparse COO gradients (``nn.Embedding(sparse=True)``) go through the same pass: their
stored values, coalesced first for fp16, exactly as GradScaler unscales them; the report judges the coalesced
values (numel counts those). Complex gradients are unscaled as their real and imaginary parts (torch's
GradScaler has no complex kernel). gradients/gradient_pass.py holds the pass, the same one ``Inspector.check()`` runs.
``last_report`` is the StepReport of the last step (no host sync to make it).

    scaler = amp_inspect.InspectingGradScaler("cuda")
    insp = amp_inspect.attach(model, scaler)   # optional: module names, history, log, activation hooks
    ...
    scaler.scale(loss).backward()
    scaler.step(opt)                            # the unscale inside is the inspection
    scaler.update()
    print(scaler.last_report)                   # reads the statistics (syncs here, when you look)

Whoever the scaler reports to (``attach`` makes the inspector do so) is its *listener*: a ``ScalerListener``,
set with ``set_listener`` and removed with ``remove_listener``. The scaler asks it for module names, formats and
the process group, and hands it each step's report at ``update()``.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from amp_inspect.core.torch_compat import (
    check_scale_growth_tracker,
    init_scale,
    loss_scale_tensor,
    optimizer_states,
    reset_growth_tracker,
    set_init_scale,
)
from amp_inspect.distributed.combine import DEFAULT_TIMEOUT_S, Combiner, Combiners, sharded_groups
from amp_inspect.gradients import gradient_pass
from amp_inspect.gradients.gradient_pass import Gradients, Measured
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.scaling._checked import loss_scale, positive_number, whole_number
from amp_inspect.scaling.policies import (
    ScaleDecision,
    ScalePolicy,
    StepStats,
    checked_policy,
    policy_class,
    policy_label,
    registered_policies,
)

DEFAULT_FORMATS = ("fp16",)


class ScalerListener(Protocol):
    """What an InspectingGradScaler needs from whoever it reports to (the inspector ``attach`` links to it)."""

    @property
    def formats(self) -> tuple[str, ...]:
        """The formats to judge the gradients against."""
        ...

    @property
    def group(self) -> dist.ProcessGroup | None:
        """The process group to combine FSDP2 shards over (None: the shards' own)."""
        ...

    @property
    def timeout(self) -> float:
        """Seconds a wait for other ranks may take."""
        ...

    def module_of(self, param: torch.Tensor) -> str | None:
        """The name of the module that owns ``param`` (None when unknown)."""
        ...

    def step_ended(self, report: StepReport | None) -> None:
        """The end of a step (``update()``): ``report`` is the step's report from the unscale pass (with its
        ``scale_decision``), None when no unscale ran in the step."""
        ...


def agree_on_found_inf(flags: Iterable[torch.Tensor], grads: list[torch.Tensor]) -> list[Any]:
    """DTensor gradients whose statistics stay per rank (sharded along several mesh dimensions, or mixed
    with plain tensors): the skip decision must still be the same on every rank, or the ranks' weights part
    ways. As torch's DTensor unscale does, take the max of found_inf over each mesh dimension that is not
    replicated (asynchronous on the device; on gloo it waits)."""
    groups = sharded_groups(grads)
    for flag in flags:
        for group in groups:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return groups


POLICIES = ("torch", "headroom")  # the names built in; policy="<name>" takes any registered one (scaling/policies.py)


def _unnamed(param: torch.Tensor) -> None:
    return None  # no listener: gradients are named by their place in the optimizer


class InspectingGradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler (same constructor and behaviour) that inspects gradients in its unscale pass.

    ``policy="torch"`` (default): GradScaler's own scale updates, bit for bit. ``policy="headroom"`` (or a
    HeadroomPolicy, or any ScalePolicy object, or the name of a registered one): the policy sets the next scale
    from the measured statistics (amp_inspect/scaling/policies.py); each update's ScaleDecision is
    ``last_report.scale_decision`` and goes to the run log with the policy's name."""

    def __init__(self, *args: Any, policy: str | ScalePolicy = "torch", **kwargs: Any) -> None:
        if isinstance(policy, str):
            names = ("torch", *registered_policies())
            if policy not in names:
                raise ValueError(
                    f"InspectingGradScaler: policy must be one of {names} or a ScalePolicy object, got {policy!r}"
                )
            # Built by name: the class passed register_policy's check, its instance is checked as any other.
            policy = None if policy == "torch" else checked_policy(policy_class(policy)(), "InspectingGradScaler")
        else:
            policy = checked_policy(policy, "InspectingGradScaler")
        _check_scaler_options(*args, **kwargs)
        super().__init__(*args, **kwargs)
        self._policy: ScalePolicy | None = policy
        if self._policy is not None and self.is_enabled():
            first = self._policy.first_scale(init_scale(self))  # no blind skips from init_scale down
            set_init_scale(
                self, loss_scale("InspectingGradScaler", f"the first scale of policy {policy_label(policy)}", first)
            )
        self.last_decision: ScaleDecision | None = None
        self._step_groups: list[Any] = []  # mesh groups whose statistics stay per rank (combined for the policy)
        self.last_report: StepReport | None = None
        self._listener: ScalerListener | None = None
        self._steps = 0  # steps completed (update() calls)
        self._unscaled_this_step = False
        self._step_parts: list[Measured] = []  # this step's unscale passes (one per optimizer)
        self._combiners = Combiners()  # FSDP2: gradients combined across ranks

    # ---- the listener and the state it reads ----

    @property
    def listener(self) -> ScalerListener | None:
        """Whoever this scaler reports to (an attached inspector), or None."""
        return self._listener

    def set_listener(self, listener: ScalerListener) -> None:
        """Reports to ``listener`` from now on. One at a time: a second one is refused until the first is removed."""
        if self._listener is not None and self._listener is not listener:
            raise RuntimeError(
                "this InspectingGradScaler already has an inspector attached (it reports to one); detach() that one "
                "first"
            )
        self._listener = listener

    def remove_listener(self, listener: ScalerListener) -> None:
        """Stops reporting to ``listener``; a scaler that reports to another one keeps it."""
        if self._listener is listener:
            self._listener = None

    @property
    def steps(self) -> int:
        """Steps completed (``update()`` calls): the number the report of the step now running carries."""
        return self._steps

    @property
    def unscaled_this_step(self) -> bool:
        """Whether an unscale pass ran in the step now running (``last_report`` is then its report)."""
        return self._unscaled_this_step

    @property
    def formats(self) -> tuple[str, ...]:
        return self._listener.formats if self._listener is not None else DEFAULT_FORMATS

    def _collect(self, optimizer: torch.optim.Optimizer, allow_fp16: bool) -> Gradients:
        """This optimizer's gradients (gradients/gradient_pass.py says which values stand for sparse and complex ones),
        named by the listener."""
        listener = self._listener
        module_of = listener.module_of if listener is not None else _unnamed
        return gradient_pass.of_optimizer(optimizer, module_of, allow_fp16)

    def _combiner(self, grads: Gradients) -> Combiner | None:
        """FSDP2 / DTensor gradients: the Combiner over the ranks that hold the other shards (None when there is
        nothing to combine)."""
        listener = self._listener
        chosen, timeout = (listener.group, listener.timeout) if listener is not None else (None, DEFAULT_TIMEOUT_S)
        return self._combiners.over(grads.shard_group, chosen, timeout)

    def _publish(self, measured: Measured) -> None:
        """Adds one unscale pass (one optimizer's gradients) to this step's report. With several optimizers
        on one scaler, the step's report covers all of them; the listener receives it once, in update()."""
        self._step_parts.append(measured)
        self.last_report = gradient_pass.step_report(self._steps, self._step_parts, loss_scale_tensor(self))
        self._unscaled_this_step = True

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool,
    ) -> dict[torch.device, torch.Tensor]:
        grads = self._collect(optimizer, allow_fp16)
        stats, per_device_found = gradient_pass.unscale(grads, inv_scale, found_inf, self.formats)
        if stats is not None:
            measured = gradient_pass.combined(grads, stats, self._combiner(grads))
            # Any rank's NaN/Inf skips the step on every rank, as torch's DTensor unscale.
            if measured.origin is not None:
                anywhere = (measured.origin.totals.sum() > 0).to(torch.float32)
                for found in per_device_found.values():
                    torch.maximum(found, anywhere.to(found.device), out=found)
            else:
                self._step_groups += agree_on_found_inf(per_device_found.values(), grads.whole)
            self._publish(measured)
        return per_device_found

    def _check_inf_per_device(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        # Fused optimizers unscale inside their own step: inspect and flag, write nothing.
        check_scale_growth_tracker(self, "_check_inf_per_device")
        grads = self._collect(optimizer, allow_fp16=True)
        found: dict[torch.device, torch.Tensor] = {}
        if len(grads):
            measured = gradient_pass.combined(grads, gradient_pass.measure(grads, self.formats), self._combiner(grads))
            any_bad = (measured.stats.nonfinite.sum() > 0).float()
            for device in {g.device for g in grads.written}:
                found[device] = any_bad.to(device, non_blocking=True)
            if measured.origin is None:
                self._step_groups += agree_on_found_inf(found.values(), grads.whole)
            self._publish(measured)
        optimizer_states(self)[id(optimizer)]["found_inf_per_device"] = found  # where GradScaler's step reads it
        return found

    def __getstate__(self) -> dict[str, Any]:
        # Pickle what GradScaler pickles; the inspection state (reports with device tensors and CUDA events,
        # the listener) belongs to the running process.
        state = super().__getstate__()
        for key in ("last_report", "_listener", "_step_parts", "_combiners", "_step_groups"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.last_report, self._listener, self._step_parts, self._combiners = None, None, [], Combiners()
        self._step_groups = []

    @property
    def policy(self) -> str:
        return "torch" if self._policy is None else self._policy.name

    def _policy_stats(self, report: StepReport) -> StepStats:
        """The policy's inputs, combined over every gradient (and every rank whose statistics stay per rank),
        read in one device-to-host copy. step() has already waited for found_inf, computed after these."""
        stats = report.stats
        scale = loss_scale_tensor(self)
        assert scale is not None
        home = scale.device
        vec = torch.stack(
            [
                stats.amax.max().to(home, torch.float64),
                stats.nan.sum().to(home, torch.float64),
                (stats.posinf + stats.neginf).sum().to(home, torch.float64),
                scale.reshape(()).to(torch.float64),
            ]
        )
        for group in self._step_groups:  # identical on every rank of the group afterwards
            dist.all_reduce(vec, op=dist.ReduceOp.MAX, group=group)
        amax, nan, inf, scale = vec.tolist()
        offenders = tuple(report.offenders) if nan or inf else ()
        return StepStats(scale=scale, amax=amax, nan=int(nan), inf=int(inf), offenders=offenders)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if state and self._policy is not None:  # "<name>_policy": a headroom state reads as it always did
            state["policy"] = self._policy.name
            state[f"{self._policy.name}_policy"] = self._policy.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """GradScaler's load_state_dict, and the policy's state when it holds one: the scaler's fields are checked
        first (ValueError naming the first bad one), then the policy loads its own state (the headroom policy
        checks it whole first), then the scale, so a bad state dict changes nothing, neither the scale nor the
        policy."""
        if not self.is_enabled():
            return  # GradScaler's own rule: a disabled scaler ignores the state
        if not isinstance(state_dict, dict):
            raise ValueError(f"InspectingGradScaler.load_state_dict: expected a dict, got {type(state_dict).__name__}")
        key = None if self._policy is None else f"{self._policy.name}_policy"
        if state_dict:
            _check_scaler_state(state_dict)
            saved = state_dict.get("policy", "headroom" if "headroom_policy" in state_dict else None)
            if saved is not None and f"{saved}_policy" in state_dict and f"{saved}_policy" != key:
                warnings.warn(
                    f"InspectingGradScaler.load_state_dict: the state was saved under policy={saved!r} and this "
                    f"scaler's policy is {self.policy!r}: its scale is loaded, the policy's state is not used",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if not state_dict or key not in state_dict:
            super().load_state_dict(state_dict)  # an empty state: GradScaler's own RuntimeError
            return
        assert self._policy is not None
        before = self._policy.state_dict()
        self._policy.load_state_dict(state_dict[key])  # raises before changing anything on a bad state
        try:
            super().load_state_dict(state_dict)
        except Exception:
            self._policy.load_state_dict(before)  # the scale did not load: neither does the policy's state
            raise

    def _checked_decision(self, decision: Any) -> ScaleDecision:
        """The policy's decision as the scaler applies and logs it (its scale a float, its ``policy`` the policy's
        name), or TypeError/ValueError naming the policy, before anything of the step changes: a NaN, 0, negative
        or Inf scale (or one float32 cannot hold) would otherwise run every later step, or fail inside torch."""
        assert self._policy is not None
        owner = "InspectingGradScaler.update"
        if not isinstance(decision, ScaleDecision):
            raise TypeError(
                f"{owner}: policy {policy_label(self._policy)} decided {decision!r:.60}, not a ScaleDecision "
                "(amp_inspect/scaling/policies.py)"
            )
        scale = loss_scale(owner, f"the scale decided by policy {policy_label(self._policy)}", decision.scale)
        if decision.policy != self._policy.name or type(decision.scale) is not float:  # the log names the policy
            decision = dataclasses.replace(decision, scale=scale, policy=self._policy.name)
        return decision

    def update(self, new_scale: float | torch.Tensor | None = None) -> None:
        # A number given here is checked as a policy's scale is (GradScaler would fill its float32 scale with a NaN,
        # 0 or Inf and go on); a tensor is GradScaler's to check: reading its value would be a host sync.
        if new_scale is not None and not isinstance(new_scale, torch.Tensor):
            new_scale = loss_scale("InspectingGradScaler.update", "new_scale", new_scale)
        decision = None
        report = self.last_report
        if self._policy is not None and self.is_enabled() and new_scale is None and self._unscaled_this_step:
            assert report is not None
            decision = self._checked_decision(
                self._policy.decide(
                    self._policy_stats(report),
                    self.get_growth_factor(),
                    self.get_backoff_factor(),
                    self.get_growth_interval(),
                )
            )
            report.annotate({"scale_decision": decision})
            self.last_decision = decision
        ended = report if self._unscaled_this_step else None
        if decision is not None:
            super().update(decision.scale)
            reset_growth_tracker(self)  # unused by the policy: clean steps since its last decision
        else:
            super().update(new_scale)
        self._steps += 1
        self._unscaled_this_step = False
        self._step_parts = []
        self._step_groups = []
        if self._listener is not None:
            self._listener.step_ended(ended)


_GRADSCALER_ARGS = ("device", "init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")


def _check_scaler_options(*args: Any, **kwargs: Any) -> None:
    """GradScaler's numeric arguments checked where they are given (torch takes ``init_scale=nan`` or "big" and
    fails, or not, steps later): ValueError naming the first bad one. Unknown names are left to torch."""
    given = dict(zip(_GRADSCALER_ARGS, args, strict=False)) | kwargs
    owner = "InspectingGradScaler"
    if "init_scale" in given:
        loss_scale(owner, "init_scale", given["init_scale"])
    if "growth_interval" in given:
        whole_number(owner, "growth_interval", given["growth_interval"], 1)
    for name in ("growth_factor", "backoff_factor"):
        if name in given:
            positive_number(owner, name, given[name])


def _check_scaler_state(state: dict[str, Any]) -> None:
    """The GradScaler fields of a state dict checked before any is loaded: ValueError naming the first bad one."""
    owner = "InspectingGradScaler.load_state_dict"
    missing = [
        k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker") if k not in state
    ]
    if missing:
        raise ValueError(f"{owner}: the state lacks {', '.join(missing)} (not a GradScaler state_dict?)")
    loss_scale(owner, "scale", state["scale"])
    for name in ("growth_factor", "backoff_factor"):
        positive_number(owner, name, state[name])
    whole_number(owner, "growth_interval", state["growth_interval"], 1)
    whole_number(owner, "_growth_tracker", state["_growth_tracker"], 0)
