"""``amp_inspect.attach(model, scaler)`` and the Inspector it returns: what users touch.

Typical loop (GradScaler on "cuda" or "cpu")::

    insp = amp_inspect.attach(model, scaler)
    for batch in data:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(batch)
        scaler.scale(loss).backward()
        report = insp.check()            # after backward, before scaler.step
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()

Cost: one fused pass over all gradients per inspected step (``every`` sets how often), no host sync on CUDA
(statistics go to pinned memory asynchronously; history and log are filled one step behind). The hooks of
``activations`` exist only while armed. ``detach()`` removes everything the inspector registered, except a
DDP comm hook (DDP cannot remove one): that hook then only averages, exactly as DDP would.

The Inspector's one job is the step: which steps to inspect, and each report on to the history. The rest is
its collaborators': attach_refusals, gradient_pass, parameter_watch, activation_arming, step_history,
run_log_sink, thread_guard, ddp.DdpLink, gradscaler_patches.ScalerLink, readiness_hooks, optimizer_watch,
run_advice (summary, doctor, the clip watch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from amp_inspect.diagnosis.doctor import ClipWatch, DoctorReport
from amp_inspect.diagnosis.history import StepRecord, Summary
from amp_inspect.diagnosis.incident import WeightPoisoning, weight_poisoning
from amp_inspect.distributed.ddp import DdpLink, HookState, NonfiniteByRank
from amp_inspect.evidence.weights import WeightsSeen
from amp_inspect.gradients import gradient_pass
from amp_inspect.gradients.step_context import StepContext
from amp_inspect.gradients.step_report import StepReport
from amp_inspect.inspection._log_sink import RunLogSink
from amp_inspect.inspection._refusals import refuse_bad_attach
from amp_inspect.inspection._step_history import StepHistory
from amp_inspect.inspection._thread_guard import OneCaller
from amp_inspect.inspection.options import AttachOptions, takes_attach_options
from amp_inspect.inspection.run_advice import RunAdvice
from amp_inspect.model.naming import ParamEntry
from amp_inspect.model.parameter_watch import ParameterWatch
from amp_inspect.model.view import ModelView
from amp_inspect.probes._activation_arming import NO_FORWARD_SEEN, ActivationArming
from amp_inspect.probes.probe import Probe, annotate_all, close_all, end_step_all
from amp_inspect.probes.weight_watch import WeightWatch, read_weights
from amp_inspect.readiness.hooks import ReadinessHooks, ReadinessReport
from amp_inspect.scaling.scaler import InspectingGradScaler
from amp_inspect.scaling.scaler_link import ScalerLink
from amp_inspect.updates.watch import OptimizerWatch, UpdateStats

__all__ = ["NO_FORWARD_SEEN", "Inspector", "attach"]


class Inspector:
    """Inspects a model's gradients each step; see the module docstring and ``attach``.

    Attributes: ``last_report`` (the StepReport of the last inspected step), ``history`` (one StepRecord
    per inspected step; reading it waits for outstanding device copies), ``formats``, ``step``, ``options``.

    It is the listener of its InspectingGradScaler (scaler.ScalerListener: ``formats``, ``group``, ``timeout``,
    ``module_of``, ``step_ended``) and of its DDP comm hook (ddp.HookListener: ``nonfinite_by_rank``,
    ``step_in_progress``): those methods are for them, not for a training loop.
    """

    @takes_attach_options
    def __init__(self, model: nn.Module, scaler: torch.amp.GradScaler | None = None, **options: Any) -> None:
        """Attaches to ``model`` (and ``scaler``); ``attach`` says the same with its own name."""
        if not isinstance(model, nn.Module):
            raise TypeError(f"attach() needs an nn.Module, got {type(model).__name__}")
        self.options = opts = AttachOptions(**options)
        # The model seen once (model/view.py): every collaborator below reads this view, none walks the model.
        self.view = view = ModelView(model)
        refuse_bad_attach(view, scaler, opts, self)  # inspection/_refusals.py: before anything is hooked
        self.model, self.formats, self.every = model, opts.formats, opts.every
        self.activations, self.arm_steps, self.collapse_skips = opts.activations, opts.arm_steps, opts.collapse_skips
        self.group, self.timeout = opts.group, opts.timeout
        self._params = ParameterWatch(view)  # parameters added or removed after attach are noticed at check()
        # formats= left to its default follows the autocast dtype the run is seen to use (gradients/step_context.py).
        self._context = StepContext(view, follow_autocast="formats" not in options)
        self._one_caller = OneCaller()
        self.step = 0  # the step the next check() inspects
        self.last_report: StepReport | None = None
        self._pass = gradient_pass.ParameterPass()
        report_group = ddp.process_group if (ddp := view.ddp) is not None else opts.group
        self._steps = StepHistory(opts.collapse_skips)
        params = self._params  # the sink's end needs the device, and must not hold the inspector
        sink_args = (opts.hist_every, self, self._steps, lambda: params.device)
        self._sink = RunLogSink.of_rank(opts.log, opts.log_all_ranks, report_group, *sink_args)
        self._arming = ActivationArming(view, opts.activations, opts.arm_steps, self.formats, self, self.step)
        self._readiness = ReadinessHooks.of_options(view, opts, self, self.step, report_group)  # readiness_every
        self._updates = OptimizerWatch.of_options(opts, self)  # update_every: what optimizer.step() did
        self._scaler = ScalerLink()
        self._inspected_step: int | None = None  # the step of an InspectingGradScaler check() inspected itself
        if scaler is not None:
            self._link(scaler)
        self._advice = RunAdvice(view, scaler, opts.watch_clipping, opts.collapse_skips)  # summary(), doctor()
        self.clip_watch: ClipWatch | None = self._advice.clip_watch  # watch_clipping=True: the doctor reads it
        self._ddp = DdpLink(view, self, opts.ddp_hook)
        # Every probe and link that adds to a report, in the order their parts are asked for (probes/probe.py): one
        # annotate pass as a report is taken in, one end_step loop at each step's end, one close loop at detach.
        self._samples = self._sink.hardware_samples(view) if self._sink is not None else None
        # After NaN/Inf gradients, one read of the weights says whether they are NaN/Inf too (never on healthy steps).
        self._weights = WeightWatch(lambda: self.entries)
        # The norm the training loop clips the gradients to, where it clips (set by the HF and Lightning callbacks
        # from the trainer's setting, and by clip_grad_norm_): the advice then does not tell it to clip.
        self.clip_norm: float | None = None
        self.probes: list[Probe] = [self._arming, self._context, self._ddp, self._readiness, self._updates]
        self.probes.append(self._weights)
        if self._samples is not None:
            self.probes.append(self._samples)

    @property
    def entries(self) -> list[ParamEntry]:
        """Every distinct parameter inspected, with its clean name and module, in registration order."""
        return self._params.entries

    # ---- scaler link ----

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        """The scaler this inspector is linked to (given to attach or check), None before one is."""
        return self._scaler.scaler

    def _link(self, scaler: torch.amp.GradScaler) -> None:
        on_skip = (lambda: self._inspect_skipped_step(scaler)) if self.every > 1 else None
        self._scaler.link(scaler, self, on_skip)

    def _inspect_skipped_step(self, scaler: torch.amp.GradScaler) -> None:
        """With every > 1, a step that a plain GradScaler skips between inspected steps still gets full
        statistics (scaling/scaler_link.py says how it is seen)."""
        last = self.last_report
        if last is None or last.step != self.step - 1:
            self._inspect(self.step - 1, scaler)
            self._steps.collect(False, self._follow_step)

    # ---- what the InspectingGradScaler and the DDP hook ask (ScalerListener, HookListener) ----

    def module_of(self, param: torch.Tensor) -> str | None:
        """The module name of ``param``, None for a parameter this inspector does not know."""
        return self._params.module_of(param)

    def step_ended(self, report: StepReport | None) -> None:
        """The end of a step: the linked InspectingGradScaler's update() hands over the report of its unscale
        pass (None when none ran); then activation findings of the step, then reports whose copies are complete."""
        if report is not None:
            own = self.last_report
            if report.scale_decision is not None and own is not None and own.step == report.step:
                own.annotate({"scale_decision": report.scale_decision})  # check() before step: the history's
            if self._inspected_step != report.step:  # check() did not inspect this step itself
                self.receive(report)
        self._after_step(optimizer_done=True)

    def nonfinite_by_rank(self) -> NonfiniteByRank:
        """The NaN/Inf counts of ddp_comm_hook (made on its first bucket: the hook may be registered by hand)."""
        return self._ddp.nonfinite_by_rank(self.entries, self.timeout)

    def step_in_progress(self) -> int:
        """The number the report of the step now running will carry (an InspectingGradScaler numbers them)."""
        scaler = self.scaler
        return scaler.steps if isinstance(scaler, InspectingGradScaler) else self.step

    @property
    def comm_hook_state(self) -> HookState:
        """The state to register ``amp_inspect.ddp_comm_hook`` with by hand (after ``attach(ddp_model,
        ddp_hook=False)``): ``ddp_model.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)``."""
        return self._ddp.hook_state(self)

    # ---- the step ----

    def check(self, scaler: torch.amp.GradScaler | None = None) -> StepReport | None:
        """Inspects this step's gradients: call once per optimizer step (with gradient accumulation: after
        the last backward), before ``scaler.step``.

        One fused pass over all parameter gradients; no host sync on CUDA (the report reads its values on
        first use). Judged as fp16 saw them: scaled gradients as stored before ``scaler.unscale_``, and
        multiplied back by the loss scale after it. Returns None on steps that ``every`` leaves out.
        With an InspectingGradScaler whose unscale already ran this step, returns its report.
        Parameters added or removed since attach are noticed here (a warning names them) and inspected from
        now on. One thread calls check(): the first one to call it, as long as it lives; a call from another
        thread raises RuntimeError (each call counts a step: two callers would record every step twice).
        """
        with self._one_caller:
            return self._check(scaler)

    def _check(self, scaler: torch.amp.GradScaler | None) -> StepReport | None:
        if self._params.refresh(stacklevel=3):  # parameters added or removed: the activation hooks follow them
            self._arming.rename(self.view)
        if scaler is not None:
            self._link(scaler)
        scaler = self.scaler
        report: StepReport | None = None
        if isinstance(scaler, InspectingGradScaler):
            # The scaler numbers the steps (its update() calls). If its unscale pass already ran, that was
            # the inspection; otherwise inspect now and tell it not to publish a second report.
            step = scaler.steps
            if self._inspected_step == step and self.last_report is not None and self.last_report.step == step:
                report = self.last_report  # check() twice in one step: once per optimizer step is enough
            elif scaler.unscaled_this_step:
                report = scaler.last_report  # history and log receive it at scaler.update()
                self.last_report = report
            elif step % self.every == 0:
                report = self._inspect(step, scaler, own_step=True)
        else:
            step = self.step
            if step % self.every == 0:
                report = self._inspect(step, scaler)
        self.step = step + 1
        if not isinstance(scaler, InspectingGradScaler):
            # Linked to an InspectingGradScaler, history and log take the step at its update() (step_ended),
            # so that the log line carries the scale decision update() makes.
            self._after_step()
        return report

    def _follow_autocast(self) -> None:
        """formats= left to its default: judge against the format of the autocast dtype the forward ran under."""
        formats = self._context.formats_to_judge(self.formats, self.scaler)
        if formats is not None:
            self.formats = formats
            self._arming.set_formats(formats)

    def _inspect(self, step: int, scaler: torch.amp.GradScaler | None, own_step: bool = False) -> StepReport:
        """One gradient pass (gradients/gradient_pass.py), judged at the plain GradScaler's scale where its unscale_
        ran. ``own_step``: check() inspected an InspectingGradScaler's step itself, so the scaler's update() must
        not hand the step over again."""
        self._follow_autocast()
        params = ((e.name, e.module, e.param) for e in self.entries)
        report = self._pass.run(step, params, self.formats, scaler, self._scaler.unscaled, self.group, self.timeout)
        if own_step:
            # Marked before the history takes it: a KeyboardInterrupt after receive() but before a mark set
            # later made update() hand the step over a second time (history [0, 1, 2, 2, 3, 4]).
            self._inspected_step = step
        self.receive(report)
        return report

    def receive(self, report: StepReport) -> None:
        """Takes a report (its own, or one an InspectingGradScaler made) into the history and the log, once each
        probe and link added its part (the one annotate pass)."""
        annotate_all(self.probes, report)
        if self.clip_norm is not None:
            report.annotate({"clip_norm": self.clip_norm})
        self._follow_autocast()  # an InspectingGradScaler reads formats at its next unscale
        self.last_report = report
        self._steps.add(report)
        self.step = max(self.step, report.step + 1)

    def _after_step(self, optimizer_done: bool = False) -> None:
        """End of a step (``optimizer_done``: at scaler.update(), after the step's optimizer steps ran or were
        skipped): activation findings of the step, then reports whose copies are complete."""
        # Activation findings, readiness_every's table, update_every's UpdateStats (the step's report waits for
        # its update until the optimizer steps are over): each probe's part at the step's end.
        end_step_all(self.probes, self.step, self.last_report, optimizer_done)
        self._steps.collect(False, self._follow_step)

    def _follow_step(self, report: StepReport, record: StepRecord) -> None:
        """A finalized step: into the run log; after a skipped or poisoned one, the activation hooks are armed
        from the next forward (``on_skip``)."""
        if self._sink is not None:
            self._sink.write(report, record, self._params.device)
        if record.skipped or record.poisoned:
            self._arming.after_skip(self.step)

    def add_listener(self, listener: Callable[[StepReport], None]) -> None:
        """Calls ``listener(report)`` for every report from now on, once its statistics are on the host (reading
        it does not wait): one step behind on CUDA. ``detach()`` removes the listeners."""
        self._steps.listeners.append(listener)

    # ---- views ----

    @property
    def history(self) -> list[StepRecord]:
        """One StepRecord per inspected step (waits for outstanding device copies)."""
        return self._steps.records(self._follow_step)

    def summary(self) -> Summary:
        """Skip rate, scale events and advice on the scaler's settings, from the history."""
        return self._advice.summary(self.history, self.scaler)

    def readiness(self) -> ReadinessReport | None:
        """The last readiness step's table (``readiness_every``; docs/readiness.md); None before one, or when off."""
        return self._readiness.last

    def weights_poisoned(self) -> WeightPoisoning | None:
        """Whether the weights became NaN/Inf in this run, and since when (diagnosis/incident.py): the step, the
        step whose optimizer step made them, where its NaN/Inf started; None while no read found them NaN/Inf. The
        weights are read after each step whose gradients held NaN/Inf (on CUDA one step later), never on healthy
        steps. Waits for outstanding device copies. A guard before saving a checkpoint::

            if (poisoning := insp.weights_poisoned()) is not None:
                raise RuntimeError(f"not saving: {poisoning.headline()}")
        """
        return weight_poisoning(self.history)

    def check_weights(self) -> WeightsSeen:
        """Reads the weights now, one fused pass over the parameters (waits for it: meant for rare moments, such as
        before saving a checkpoint), and says which modules' weights hold NaN/Inf (``.finite``, ``.nonfinite``:
        module -> count). Sharded parameters are read by this rank's shards (``.partial`` says so)."""
        check = read_weights(self.entries, self.step)
        return WeightsSeen(self.step) if check is None else check.seen

    def checkpoint_warning(self) -> str | None:
        """One sentence when the weights hold NaN/Inf now (check_weights), with the run's story of how they
        became so (weights_poisoned) where it is known; None when they are finite. The HF and Lightning callbacks
        warn with it when a checkpoint is saved."""
        seen = self.check_weights()
        if seen.finite:
            return None
        poisoning = self.weights_poisoned()
        story = f": {poisoning.headline()}" if poisoning is not None else ""
        return f"amp_inspect: the weights being saved hold NaN/Inf ({seen.describe()}){story}"

    @property
    def last_update(self) -> UpdateStats | None:
        """What the last measured optimizer step did, per module (``update_every``); None before one, or when off."""
        return self._updates.last

    def doctor(self, optimizer: torch.optim.Optimizer | None = None, autocast_dtype: Any = None) -> DoctorReport:
        """The AMP doctor on this model, its scaler, the history so far and the clipping watch (when on)."""
        return self._advice.doctor(self.history, self.scaler, optimizer, autocast_dtype)

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips all gradients to a global L2 norm of ``max_norm`` using the norm of the last check() (same
        pass: no further read of the gradients to measure them), as torch.nn.utils.clip_grad_norm_ does.
        Call it after ``scaler.unscale_(opt)`` and ``check()``; the norm is the unscaled one. Returns it."""
        params = (e.param for e in self.entries)
        self.clip_norm = float(max_norm)  # the loop clips: the advice says so from the next report on
        return gradient_pass.clip_by_report(params, max_norm, norm_type, self.last_report, self.step - 1)

    def close(self) -> None:
        """Writes out outstanding reports and closes the log (waits for outstanding device copies)."""
        self._steps.collect(True, self._follow_step)
        if self._sink is not None:
            self._sink.close()
            self._sink = None  # later steps are still inspected, no longer logged
            if self._samples in self.probes:
                self.probes.remove(self._samples)

    def detach(self) -> None:
        """Removes every hook and patch this inspector registered and closes its log."""
        close_all(self.probes)
        self._scaler.remove(self)  # an InspectingGradScaler that reports to another inspector keeps it
        self._advice.close()
        self.close()
        self._steps.listeners.clear()

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


@takes_attach_options
def attach(model: nn.Module, scaler: torch.amp.GradScaler | None = None, **options: Any) -> Inspector:
    """Attaches an Inspector to ``model`` (and ``scaler``): see amp_inspect/inspection/inspector.py."""
    return Inspector(model, scaler, **options)
