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
its collaborators': gradient_pass, parameter_watch, activation_arming, step_history, run_log_sink,
thread_guard, ddp.DdpLink, gradscaler_patches.ScalerLink.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import gradient_pass, hardware
from ._torch_compat import init_scale, loss_scale_tensor
from .activation_arming import NO_FORWARD_SEEN, ActivationArming
from .activations import ActivationWatcher
from .checks import ClipWatch, DoctorReport, doctor
from .ddp import DdpLink, HookState, NonfiniteByRank, check_attach, ddp_of
from .distributed import Combiners, log_path_of_rank
from .gradscaler_patches import GradScalerPatches, ScalerLink
from .history import StepRecord, Summary, summarize
from .naming import ParamEntry
from .options import AttachOptions, takes_attach_options
from .parameter_watch import ParameterWatch
from .readiness_hooks import ReadinessHooks, ReadinessReport
from .report import StepReport
from .run_log_sink import RunLogSink
from .scaler import InspectingGradScaler
from .step_context import StepContext
from .step_history import StepHistory
from .thread_guard import OneCaller
from .wrappers import refuse_fsdp1

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
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
        if opts.watch_clipping and scaler is None:
            raise ValueError("watch_clipping needs the scaler: attach(model, scaler, watch_clipping=True)")
        ScalerLink.refuse_taken(scaler, self)
        refuse_fsdp1(model)
        check_attach(model, opts.group, opts.ddp_hook)
        self.model, self.formats, self.every = model, opts.formats, opts.every
        self.activations, self.arm_steps, self.collapse_skips = opts.activations, opts.arm_steps, opts.collapse_skips
        self.group, self.timeout = opts.group, opts.timeout
        self._params = ParameterWatch(model)  # parameters added or removed after attach are noticed at check()
        # formats= left to its default follows the autocast dtype the run is seen to use (step_context.py).
        self._context = StepContext(model, self.entries, follow_autocast="formats" not in options)
        self._one_caller = OneCaller()
        self.step = 0  # the step the next check() inspects
        self.last_report: StepReport | None = None
        self._warned_local = False
        self._combiners = Combiners()
        ddp = ddp_of(model)
        report_group = ddp.process_group if ddp is not None else opts.group
        log_path = log_path_of_rank(opts.log, opts.log_all_ranks, report_group) if opts.log is not None else None
        self._sink = RunLogSink(log_path, opts.hist_every, self) if log_path is not None else None
        self._steps = StepHistory(opts.collapse_skips, keep_module_norms=self._sink is not None)
        self._arming = ActivationArming(model, opts.activations, opts.arm_steps, self.formats, self, self.step)
        self._readiness = ReadinessHooks.of_options(model, opts, self, self.step, report_group)  # readiness_every
        self._scaler = ScalerLink()
        self._inspected_step: int | None = None  # the step of an InspectingGradScaler check() inspected itself
        if scaler is not None:
            self._link(scaler)
        # Opt-in: record clip_grad_norm_ calls made while the gradients are still scaled (doctor()).
        self.clip_watch: ClipWatch | None = ClipWatch(scaler) if opts.watch_clipping else None
        self._ddp = DdpLink(model, self, opts.ddp_hook)

    @property
    def entries(self) -> list[ParamEntry]:
        """Every distinct parameter inspected, with its clean name and module, in registration order."""
        return self._params.entries

    # Thin aliases for tests that look inside (tests/test_silent_answers.py, test_names_and_doctor.py).
    @property
    def _watcher(self) -> ActivationWatcher | None:
        return self._arming.watcher

    @property
    def _scaler_patches(self) -> GradScalerPatches:
        return self._scaler.patches

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
        statistics (gradscaler_patches.py says how it is seen)."""
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
                own.scale_decision = report.scale_decision  # check() before step: its report is the history's
            if self._inspected_step != report.step:  # check() did not inspect this step itself
                self.receive(report)
        self._after_step()

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
        with self._one_caller.held():
            return self._check(scaler)

    def _check(self, scaler: torch.amp.GradScaler | None) -> StepReport | None:
        self._refresh_params()
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
                report = self._inspect(step, scaler)
                self._inspected_step = step
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

    def _refresh_params(self) -> None:
        """The current parameters and names (parameter_watch.py); the activation hooks follow new modules."""
        if self._params.refresh(stacklevel=4):
            self._arming.rename(self.model)

    def _follow_autocast(self) -> None:
        """formats= left to its default: judge against the format of the autocast dtype the forward ran under."""
        formats = self._context.formats_to_judge(self.formats, self.scaler)
        if formats is not None:
            self.formats = formats
            self._arming.set_formats(formats)

    def _inspect(self, step: int, scaler: torch.amp.GradScaler | None) -> StepReport:
        """One gradient pass (gradient_pass.py), judged at the plain GradScaler's scale where its unscale_ ran."""
        self._follow_autocast()
        grads = gradient_pass.of_parameters((e.name, e.module, e.param) for e in self.entries)
        if grads.partial and not self._warned_local:
            self._warned_local = True
            warnings.warn(f"amp_inspect: {grads.partial}", RuntimeWarning, stacklevel=3)
        skips = scaler is not None and scaler.is_enabled()
        scale = loss_scale_tensor(scaler) if skips else None  # GradScaler's own scale tensor
        unscaled = self._scaler.unscaled(scaler, grads.params) if scale is not None else None
        stats = gradient_pass.measure(grads, self.formats, scale, unscaled)
        combiner = self._combiners.over(grads.shard_group, self.group, self.timeout)
        measured = gradient_pass.combined(grads, stats, combiner)  # collective: every rank's check() takes part
        report = gradient_pass.step_report(step, [measured], scale, skips=skips)
        self.receive(report)
        return report

    def receive(self, report: StepReport) -> None:
        """Takes a report made elsewhere (InspectingGradScaler) into the history and the log."""
        if report.first_nonfinite is None:
            report.first_nonfinite = self._arming.take_finding(report.step)
        self._context.annotate(report)
        # Finalized records only (no sync): str(report) shows the median of these and its own recommendation.
        report.recent_recommended = self._steps.recent_recommended()
        self._follow_autocast()  # an InspectingGradScaler reads formats at its next unscale
        self._ddp.add_origin(report)  # DDP: this step's NaN/Inf counts from before the all-reduce
        if self._sink is not None:  # memory of this step, sampled now (no sync): the log is written later
            report.hardware = hardware.sample(self._device())
        self.last_report = report
        self._steps.add(report)
        self.step = max(self.step, report.step + 1)

    def _device(self) -> torch.device | None:
        return self.entries[0].param.device if self.entries else None

    def _after_step(self) -> None:
        """End of a step: activation findings of the step, then reports whose copies are complete."""
        self._arming.end_step(self.step, self.last_report)
        self._readiness.end_step(self.step, self.last_report)  # readiness_every: the table into the step's report
        self._steps.collect(False, self._follow_step)

    def _follow_step(self, report: StepReport, record: StepRecord) -> None:
        """A finalized step: into the run log; after a skipped or poisoned one, the activation hooks are armed
        from the next forward (``on_skip``)."""
        if self._sink is not None:
            self._sink.write(report, record, self._device())
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
        scaler = self.scaler
        kwargs: dict[str, Any] = {}
        if scaler is not None and scaler.is_enabled():
            kwargs = {
                "init_scale": init_scale(scaler),
                "growth_interval": scaler.get_growth_interval(),
                "backoff_factor": scaler.get_backoff_factor(),
            }
        return summarize(self.history, collapse_skips=self.collapse_skips, **kwargs)

    def readiness(self) -> ReadinessReport | None:
        """The last readiness step's table (``readiness_every``; docs/readiness.md); None before one, or when off."""
        return self._readiness.last

    def doctor(self, optimizer: torch.optim.Optimizer | None = None, autocast_dtype: Any = None) -> DoctorReport:
        """The AMP doctor on this model, its scaler, the history so far and the clipping watch (when on)."""
        return doctor(
            self.model,
            optimizer,
            self.scaler,
            autocast_dtype=autocast_dtype,
            history=self.history,
            clip_watch=self.clip_watch,
            collapse_skips=self.collapse_skips,
        )

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clips all gradients to a global L2 norm of ``max_norm`` using the norm of the last check() (same
        pass: no further read of the gradients to measure them), as torch.nn.utils.clip_grad_norm_ does.
        Call it after ``scaler.unscale_(opt)`` and ``check()``; the norm is the unscaled one. Returns it."""
        if norm_type != 2.0:
            raise ValueError("clip_grad_norm_ uses the L2 norm of the inspection; norm_type must be 2")
        report = self.last_report
        if report is None or report.step != self.step - 1:
            raise RuntimeError("call check() on this step before clip_grad_norm_ (every= may have skipped it)")
        total = report.total_norm_tensor
        gradient_pass.clip_((e.param for e in self.entries), max_norm, total)
        return total

    def close(self) -> None:
        """Writes out outstanding reports and closes the log (waits for outstanding device copies)."""
        self._steps.collect(True, self._follow_step)
        if self._sink is not None:
            self._sink.close()
            self._sink = None  # later steps are still inspected, no longer logged
            self._steps.keep_module_norms = False

    def detach(self) -> None:
        """Removes every hook and patch this inspector registered and closes its log."""
        self._arming.close()
        self._readiness.close()
        self._scaler.remove(self)  # an InspectingGradScaler that reports to another inspector keeps it
        self._context.remove()
        self._ddp.release(self)
        if self.clip_watch is not None:
            self.clip_watch.close()
        self.close()
        self._steps.listeners.clear()

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


@takes_attach_options
def attach(model: nn.Module, scaler: torch.amp.GradScaler | None = None, **options: Any) -> Inspector:
    """Attaches an Inspector to ``model`` (and ``scaler``): see amp_inspect/inspector.py."""
    return Inspector(model, scaler, **options)
