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
"""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from . import hardware
from .activations import ActivationWatcher
from .autocast_watch import AUTOCAST_OFF, AutocastWatch
from .backward_order import BackwardOrder
from .checks import ClipWatch, DoctorReport, doctor
from .ddp import HookState, NonfiniteByRank, ddp_of, register, release
from .distributed import Combiners, global_ranks, is_distributed, local_shards, log_path_of_rank, to_local
from .gradscaler_patches import GradScalerPatches
from .hist_schedule import HistogramSchedule
from .history import RECENT_STEPS, StepRecord, Summary, collapse_warning, summarize
from .naming import ParamEntry, grads_of, module_names, param_entries, parameter_layout
from .options import AttachOptions, takes_attach_options
from .printable import shown_name
from .report import BEFORE_ALLREDUCE, SHARDS, StepReport
from .runlog import RunLog
from .scaler import InspectingGradScaler
from .spikes import SPIKE_WINDOW, is_spike
from .stats import SUPPORTED_DTYPES, TensorStats, merge_rows, stats_outputs, tensor_stats
from .wrappers import (
    eager_stance,
    has_fsdp2_modules,
    is_compiled,
    refuse_fsdp1,
    refuse_sparse_with_comm_hook,
    set_dynamo_stance,
)

# No commas: the HTML report lists findings up to their first comma.
NO_FORWARD_SEEN = (
    "not searched: the armed activation hooks saw no forward pass in this step (does the loop call a "
    "torch.compile wrapper that the inspector was not attached to? Compiled code does not call hooks added after "
    "compiling: attach the compiled model itself)"
)


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
        self._refuse_a_taken_scaler(scaler)
        activations, group = opts.activations, opts.group
        refuse_fsdp1(model)
        ddp = ddp_of(model)
        if ddp is not None and opts.ddp_hook and is_distributed(ddp.process_group):
            refuse_sparse_with_comm_hook(model)
        if ddp is not None and group is not None and global_ranks(group) != global_ranks(ddp.process_group):
            raise ValueError(
                "group= differs from the DDP model's process group: the DDP hook reports over the group DDP averages "
                "over; leave group= out (or pass that group)"
            )
        self.model = model
        self.formats = opts.formats
        # formats= left to its default follows the autocast dtype the run is seen to use (a bf16 run: bf16), unless
        # a GradScaler is attached: a loss scale is fp16's tool, and its headroom is judged against fp16.
        self._formats_follow_autocast = "formats" not in options
        self.every = opts.every
        self.activations = activations
        self.arm_steps = opts.arm_steps
        self.collapse_skips = opts.collapse_skips
        self.entries: list[ParamEntry] = param_entries(model)
        self._module_of_param = {id(e.param): e.module for e in self.entries}
        # The order autograd makes the modules' gradients in, from the first backward (the blame of a skipped step).
        self._backward_order = BackwardOrder((e.param, e.module) for e in self.entries)
        device_type = self.entries[0].param.device.type if self.entries else "cpu"
        self._autocast = AutocastWatch(model, "cuda" if device_type == "meta" else device_type)
        # Parameters added or removed after attach are noticed at check() (FSDP2 swaps its parameters itself).
        self._watch_params = not has_fsdp2_modules(model)
        self._param_ids = parameter_layout(model) if self._watch_params else ()
        self._check_lock = threading.Lock()  # check() from a second thread at once is refused
        self._check_thread: threading.Thread | None = None  # the thread that calls check() (its first caller)
        self._collect_lock = threading.RLock()  # history read from another thread while check() collects
        # torch.compile does not call hooks added after compiling: armed steps run eagerly (force_eager stance).
        self._compiled = activations != "off" and is_compiled(model)
        self._prior_stance: object | None = None
        if self._compiled and activations == "always":
            warnings.warn(
                "amp_inspect: activations='always' on a torch.compile'd model runs every step eagerly (compiled code "
                "does not call the activation hooks); use activations='on_skip' to run eagerly only for a few steps "
                "after a skipped step",
                RuntimeWarning,
                stacklevel=3,
            )
        self.step = 0  # the step the next check() inspects
        self.last_report: StepReport | None = None
        self._pending: deque[StepReport] = deque()
        self._history: list[StepRecord] = []
        self._previous_report: StepReport | None = None  # the last finalized one (spikes compare with it)
        self._warned_collapse = False
        self.group = group
        self.timeout = opts.timeout
        self._combiners = Combiners()
        report_group = ddp.process_group if ddp is not None else group
        log_path = log_path_of_rank(opts.log, opts.log_all_ranks, report_group) if opts.log is not None else None
        self._log = RunLog(log_path, hist_every=opts.hist_every) if log_path is not None else None
        self._hists = HistogramSchedule(opts.hist_every)  # regular steps, and those of an incident
        # A run that ends without close() or detach() still closes its log at exit (no ResourceWarning, no lost
        # buffered lines of the steps already written).
        self._log_closer = weakref.finalize(self, self._log.close) if self._log is not None else None
        self._watcher = ActivationWatcher(model, formats=self.formats) if activations != "off" else None
        if self._watcher is not None:
            self._watcher.close_when_dropped(self)  # dropped without detach(): its hooks leave the model
        self._armed_until = -1
        self._findings: dict[int, str] = {}  # activation findings of steps that had no report yet
        self.scaler: torch.amp.GradScaler | None = None
        self._scaler_patches = GradScalerPatches()
        self._inspected_step: int | None = None  # the step of an InspectingGradScaler check() inspected itself
        if self._watcher is not None and activations == "always":
            self._arm_watcher()
            self._watcher.new_step(self.step)
        self._warned_local = False
        self._warned_no_forward = False
        if scaler is not None:
            self._link(scaler)
        # Opt-in: record clip_grad_norm_ calls made while the gradients are still scaled (doctor()).
        self.clip_watch: ClipWatch | None = None
        if opts.watch_clipping:
            self.clip_watch = ClipWatch(scaler)
        self._hardware_note_written = False
        self._log_error: str | None = None  # the last failed log write, warned about once per error kind
        self._listeners: list[Callable[[StepReport], None]] = []
        self._nonfinite_by_rank: NonfiniteByRank | None = None
        self._manual_hook: HookState | None = None  # comm_hook_state, for a hook registered by hand
        if ddp is not None and is_distributed(ddp.process_group):
            # Either hook state is made now, before any backward: its exact averaging watches every accumulation.
            if not opts.ddp_hook:
                self._manual_hook = HookState(ddp, self)
            elif why_not := register(ddp, self):
                warnings.warn(
                    f"amp_inspect: {why_not}, so NaN/Inf cannot be traced to the rank that produced them (reports "
                    "cover the averaged gradients only)",
                    RuntimeWarning,
                    stacklevel=3,
                )

    # ---- scaler link ----

    def _refuse_a_taken_scaler(self, scaler: torch.amp.GradScaler | None) -> None:
        if isinstance(scaler, InspectingGradScaler) and scaler.listener not in (None, self):
            raise RuntimeError(
                "this InspectingGradScaler already has an inspector attached (it reports to one); detach() that one "
                "first, or attach this one to a plain GradScaler"
            )

    def _link(self, scaler: torch.amp.GradScaler) -> None:
        if self.scaler is scaler:
            return
        self._refuse_a_taken_scaler(scaler)
        self.scaler = scaler
        if isinstance(scaler, InspectingGradScaler):
            scaler.set_listener(self)
            return
        self._scaler_patches.record_unscales(scaler)
        if self.every > 1 and hasattr(scaler, "_maybe_opt_step"):
            self._scaler_patches.call_on_skip(scaler, lambda: self._inspect_skipped_step(scaler))

    def _inspect_skipped_step(self, scaler: torch.amp.GradScaler) -> None:
        """With every > 1, a step that a plain GradScaler skips between inspected steps still gets full
        statistics (gradscaler_patches.py says how it is seen)."""
        last = self.last_report
        if last is None or last.step != self.step - 1:
            self._inspect(self.step - 1, scaler)
            self._collect(wait=False)

    # ---- what the InspectingGradScaler and the DDP hook ask (ScalerListener, HookListener) ----

    def module_of(self, param: torch.Tensor) -> str | None:
        """The module name of ``param``, None for a parameter this inspector does not know."""
        return self._module_of_param.get(id(param))

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
        if self._nonfinite_by_rank is None:
            self._nonfinite_by_rank = NonfiniteByRank(self._ddp_for_hook(), self.entries, self.timeout)
        return self._nonfinite_by_rank

    def step_in_progress(self) -> int:
        """The number the report of the step now running will carry (an InspectingGradScaler numbers them)."""
        scaler = self.scaler
        return scaler.steps if isinstance(scaler, InspectingGradScaler) else self.step

    @property
    def comm_hook_state(self) -> HookState:
        """The state to register ``amp_inspect.ddp_comm_hook`` with by hand (after ``attach(ddp_model,
        ddp_hook=False)``): ``ddp_model.register_comm_hook(insp.comm_hook_state, amp_inspect.ddp_comm_hook)``."""
        refuse_sparse_with_comm_hook(self.model)
        if self._manual_hook is None:
            self._manual_hook = HookState(self._ddp_for_hook(), self)
        return self._manual_hook

    def _ddp_for_hook(self) -> nn.parallel.DistributedDataParallel:
        ddp = ddp_of(self.model)
        if ddp is None:
            raise RuntimeError(
                "amp_inspect.ddp_comm_hook: attach the inspector to the DistributedDataParallel model itself "
                "(attach(ddp_model)), so that the hook averages over DDP's process group"
            )
        return ddp

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
        if not self._check_lock.acquire(blocking=False):
            raise RuntimeError(
                "amp_inspect: check() is already running in another thread; call it from the training loop's "
                "thread only, once per optimizer step"
            )
        try:
            current, owner = threading.current_thread(), self._check_thread
            if owner is not None and owner is not current and owner.is_alive():
                raise RuntimeError(
                    f"amp_inspect: check() called from thread {current.name!r}, but thread {owner.name!r} calls it "
                    "for this inspector (each call counts a step: two callers would record every step twice); call "
                    "it from the training loop's thread only, or attach another inspector"
                )
            self._check_thread = current
            return self._check(scaler)
        finally:
            self._check_lock.release()

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
        """Notices parameters added to or removed from the model since attach, with a warning, and modules
        wrapped or moved in place (the same parameters under new names), silently (one pass over
        ``model.named_parameters()``, no device work); inspects the current set, by its current names, from now on."""
        if not self._watch_params:
            return
        ids = parameter_layout(self.model)
        if ids == self._param_ids:
            return
        old = {id(e.param): e.name for e in self.entries}
        self.entries = param_entries(self.model)
        self._module_of_param = {id(e.param): e.module for e in self.entries}
        self._param_ids = ids
        added = [e.name for e in self.entries if id(e.param) not in old]
        kept = {id(e.param) for e in self.entries}
        removed = [name for key, name in old.items() if key not in kept]
        if self._watcher is not None:  # modules added with them are watched too
            was_armed = self._watcher.armed
            self._disarm_watcher()
            self._watcher.names = dict(module_names(self.model))
            if was_armed:
                self._arm_watcher()
        if added or removed:
            parts = [
                f"{label} {', '.join(map(shown_name, names[:10]))}{' ...' if len(names) > 10 else ''}"
                for label, names in (("added", added), ("removed", removed))
                if names
            ]
            warnings.warn(
                f"amp_inspect: the model's parameters changed since attach ({'; '.join(parts)}): inspecting the "
                "current ones from now on",
                RuntimeWarning,
                stacklevel=4,
            )

    def _arm_watcher(self) -> None:
        """Arms the activation hooks; on a torch.compile'd model, compiled code runs eagerly while they are armed
        (torch.compile does not call hooks added after compiling, and tracing into them recompiles every step)."""
        assert self._watcher is not None
        if self._compiled and self._prior_stance is None:
            stance = eager_stance()
            if stance is not None:
                self._prior_stance = set_dynamo_stance(stance)
        self._watcher.arm()

    def _disarm_watcher(self) -> None:
        assert self._watcher is not None
        self._watcher.disarm()
        if self._prior_stance is not None:
            set_dynamo_stance(self._prior_stance)
            self._prior_stance = None

    def _follow_autocast(self) -> None:
        """formats= left to its default: judge against the format of the autocast dtype the forward ran under."""
        seen = self._autocast.seen
        if not self._formats_follow_autocast or seen in (None, AUTOCAST_OFF) or self.formats[0] == seen:
            return
        if self.scaler is not None and self.scaler.is_enabled():
            return
        self.formats = (seen, *(f for f in self.formats if f != seen))
        if self._watcher is not None:
            self._watcher.formats = self.formats

    def _inspect(self, step: int, scaler: torch.amp.GradScaler | None) -> StepReport:
        self._follow_autocast()
        whole, rows = grads_of(self.entries)
        for grad, row in zip(whole, rows, strict=True):
            # Named here: tensor_stats would only say "tensor i".
            if grad.dtype not in SUPPORTED_DTYPES or grad.device.type == "meta":
                what = "is on the meta device (no values)" if grad.device.type == "meta" else f"is {grad.dtype}"
                raise TypeError(
                    f"amp_inspect: the gradient of parameter {self.entries[row].name!r} {what}; amp_inspect inspects "
                    "float32, float16, bfloat16 and float64 gradients (complex ones as their real and imaginary parts)"
                )
        # FSDP2 / DTensor gradients: inspect this rank's shards, then combine the shards of all ranks.
        grads, shard_group, local_only = local_shards(whole)
        if local_only and not self._warned_local:
            self._warned_local = True
            warnings.warn(f"amp_inspect: {local_only}", RuntimeWarning, stacklevel=3)
        scale = None
        unscaled: list[bool] = [False] * len(grads)
        skips = scaler is not None and scaler.is_enabled()
        if skips and getattr(scaler, "_scale", None) is not None:  # GradScaler's own scale tensor
            scale = scaler._scale
            unscaled = self._scaler_patches.unscaled(scaler, [self.entries[r].param for r in rows])
        if any(unscaled) and scale is not None and scale.device.type == "cpu":
            value = float(scale)  # on the host: no sync. A broken scale cannot be judged at (the report says why)
            if not (math.isfinite(value) and value > 0):
                unscaled = [False] * len(grads)
        if all(unscaled) or not any(unscaled):
            judge_at = scale if unscaled and unscaled[0] else None
            stats = tensor_stats(grads, scale=judge_at, formats=self.formats)
        else:
            # Some optimizers' gradients are unscaled already, others not: judge each group in its own
            # picture (the unscaled ones multiplied back by the scale) and put the rows back in order.
            groups = [[i for i, u in enumerate(unscaled) if u is flag] for flag in (True, False)]
            parts = [
                (group, stats_outputs(tensor_stats([grads[i] for i in group], scale=judge, formats=self.formats)))
                for group, judge in zip(groups, (scale, None), strict=True)
            ]
            stats = TensorStats.from_op_outputs(merge_rows(parts, len(grads), grads[0].device), self.formats)
        merged = None
        combiner = self._combiners.over(shard_group, self.group, self.timeout)
        if combiner is not None:
            shapes = [tuple(g.shape) for g in whole]  # a DTensor's shape is the whole parameter's
            merged = combiner.combine(stats, shapes)  # collective: every rank's check() takes part
            stats = merged.stats
        modules = [self.entries[r].module for r in rows]
        sparse = [self.entries[r].module for r in rows if self.entries[r].param.grad.layout == torch.sparse_coo]
        report = StepReport(step, stats, modules, scale, skips=skips, sparse_modules=sparse)
        if merged is not None:
            report.set_rank_origin(merged.nonfinite_by_rank, modules, merged.ranks, kind=SHARDS)
        self.receive(report)
        return report

    def receive(self, report: StepReport) -> None:
        """Takes a report made elsewhere (InspectingGradScaler) into the history and the log."""
        if report.first_nonfinite is None:
            report.first_nonfinite = self._findings.pop(report.step, None)
        report.backward_order = self._backward_order.take()
        report.autocast = self._autocast.seen
        self._autocast.settle()
        # Finalized records only (no sync): str(report) shows the median of these and its own recommendation.
        recent = [r.recommended_scale for r in self._history[-(RECENT_STEPS - 1) :] if not r.skipped]
        report.recent_recommended = [x for x in recent if x]
        self._follow_autocast()  # an InspectingGradScaler reads formats at its next unscale
        origin = self._nonfinite_by_rank
        if origin is not None:  # DDP: this step's NaN/Inf counts from before the all-reduce
            counts = origin.take(report.step)
            if counts is not None:
                report.set_rank_origin(counts, origin.modules, origin.ranks, kind=BEFORE_ALLREDUCE)
        if self._log is not None:  # memory of this step, sampled now (no sync): the log is written later
            report.hardware = hardware.sample(self.entries[0].param.device if self.entries else None)
        self.last_report = report
        self._pending.append(report)
        self.step = max(self.step, report.step + 1)

    def _after_step(self) -> None:
        """End of a step: activation findings of the step, then reports whose copies are complete."""
        self._harvest_activations()
        self._collect(wait=False)

    def _harvest_activations(self) -> None:
        watcher = self._watcher
        if watcher is None or not watcher.armed:
            return
        finding: object = watcher.first_finding()  # diagnosis mode only: reads the hook statistics (syncs)
        step = self.step - 1  # the step whose forward and backward the hooks saw
        if finding is None and watcher.step == step and watcher.names and not watcher.records:
            # Armed for a whole step and not one module's forward recorded: the hooks were bypassed. Say so
            # rather than leave "first non-finite producer" silently empty.
            finding = NO_FORWARD_SEEN
            if not self._warned_no_forward:
                self._warned_no_forward = True
                warnings.warn(f"amp_inspect: first non-finite producer {NO_FORWARD_SEEN}", RuntimeWarning, stacklevel=4)
        if finding is not None:
            report = self.last_report
            if report is not None and report.step == step:
                if report.first_nonfinite is None:
                    report.first_nonfinite = str(finding)
            else:  # no report for this step yet: one made later for it (a skip under every=N) takes it
                self._findings = {s: f for s, f in self._findings.items() if s >= step - self.arm_steps}
                self._findings[step] = str(finding)
        if self.activations == "on_skip" and self.step > self._armed_until:
            self._disarm_watcher()
        else:
            watcher.new_step(self.step)

    def _collect(self, wait: bool) -> None:
        with self._collect_lock:  # another thread reading history must not finalize the same report twice
            while self._pending and (wait or self._pending[0].ready()):
                self._finalize(self._pending.popleft())

    def add_listener(self, listener: Callable[[StepReport], None]) -> None:
        """Calls ``listener(report)`` for every report from now on, once its statistics are on the host (reading
        it does not wait): one step behind on CUDA. ``detach()`` removes the listeners."""
        self._listeners.append(listener)

    def _module_norms(self, report: StepReport) -> dict[str, float | None]:
        return {name: m["grad_norm"] for name, m in report.by_module.items()}

    def _finalize(self, report: StepReport) -> None:
        record = StepRecord.from_report(report)
        # Per-module norms (a loop over the rows) where the log makes them anyway, or on a spike, with the step
        # before's (kept as its report): the summary names the modules whose norm rose most.
        spike = is_spike(record.total_norm, [r.total_norm for r in self._history[-SPIKE_WINDOW:]]) is not None
        if self._log is not None or spike:
            record = dataclasses.replace(record, module_norms=self._module_norms(report))
        before = self._previous_report
        if spike and before is not None and self._history and self._history[-1].module_norms is None:
            self._history[-1] = dataclasses.replace(self._history[-1], module_norms=self._module_norms(before))
        self._previous_report = report
        self._history.append(record)
        if self._log is not None:
            wants = self._hists.wants(
                report.step, skipped=record.skipped or record.poisoned, total_norm=record.total_norm
            )
            entry = report.to_record(with_hist=wants)
            entry["hardware"] = report.hardware
            if not self._hardware_note_written:
                self._hardware_note_written = True
                hardware_note = hardware.note(self.entries[0].param.device if self.entries else None)
                if hardware_note:
                    entry["hardware_note"] = hardware_note
            self._write_log(entry)
        if (record.skipped or record.poisoned) and self._watcher is not None and self.activations == "on_skip":
            # Armed from the next forward (step self.step) for arm_steps steps.
            self._armed_until = self.step + self.arm_steps - 1
            if not self._watcher.armed:
                self._arm_watcher()
                self._watcher.new_step(self.step)
        for listener in self._listeners:
            listener(report)
        message = collapse_warning(self._history, self.collapse_skips)
        if message and not self._warned_collapse:
            warnings.warn(f"amp_inspect: {message}", RuntimeWarning, stacklevel=3)
        self._warned_collapse = message is not None

    def _write_log(self, entry: dict[str, Any]) -> None:
        """A log line that cannot be written (disk full, a network file system gone) costs that line, never the
        training run, the history or the listeners: one warning, and the next step tries again (RunLog starts it on
        a fresh line, and read_log skips the torn one)."""
        assert self._log is not None
        try:
            self._log.write(entry)
        except OSError as error:
            message = f"{type(error).__name__}: {error.strerror or error}"
            if message != self._log_error:
                warnings.warn(
                    f"amp_inspect: could not write step {entry.get('step')} to the run log {self._log.path} "
                    f"({message}); training and inspection go on, and later steps are written again when the file "
                    "takes them.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            self._log_error = message
        else:
            self._log_error = None

    # ---- views ----

    @property
    def history(self) -> list[StepRecord]:
        """One StepRecord per inspected step (waits for outstanding device copies)."""
        self._collect(wait=True)
        return list(self._history)

    def summary(self) -> Summary:
        """Skip rate, scale events and advice on the scaler's settings, from the history."""
        scaler = self.scaler
        kwargs: dict[str, Any] = {}
        if scaler is not None and scaler.is_enabled():
            kwargs = {
                "init_scale": getattr(scaler, "_init_scale", None),
                "growth_interval": scaler.get_growth_interval(),
                "backoff_factor": scaler.get_backoff_factor(),
            }
        return summarize(self.history, collapse_skips=self.collapse_skips, **kwargs)

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
        grads = [e.param.grad for e in self.entries if e.param.grad is not None]
        # A DTensor's shard is scaled in place, like the whole; a sparse gradient's stored values (coalescing
        # commutes with scaling), a complex one's real and imaginary parts.
        grads = [to_local(g._values() if g.layout == torch.sparse_coo else g) for g in grads]
        grads = [torch.view_as_real(g) if g.is_complex() else g for g in grads]
        total = report.total_norm_tensor
        if not grads:
            return total
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        by_device: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
        for g in grads:
            by_device.setdefault((g.device, g.dtype), []).append(g)
        for (device, _), group in by_device.items():
            torch._foreach_mul_(group, coef.to(device))
        return total

    def close(self) -> None:
        """Writes out outstanding reports and closes the log (waits for outstanding device copies)."""
        self._collect(wait=True)
        if self._log is not None:
            self._log.close()
            self._log = None
            if self._log_closer is not None:
                self._log_closer.detach()  # later steps are still inspected, no longer logged

    def detach(self) -> None:
        """Removes every hook and patch this inspector registered and closes its log."""
        if self._watcher is not None:
            self._disarm_watcher()
            self._watcher.close()  # for good: a later check() does not re-arm, hooks on model copies go quiet
        self._scaler_patches.remove()
        self._backward_order.remove()
        self._autocast.remove()
        if isinstance(self.scaler, InspectingGradScaler):
            self.scaler.remove_listener(self)  # a scaler that reports to another inspector keeps it
        ddp = ddp_of(self.model)
        if ddp is not None:
            # DDP cannot unregister a comm hook: from now on it only averages (detach on every rank alike).
            release(ddp, self)
            if self._manual_hook is not None:
                self._manual_hook.listener = None
        if self.clip_watch is not None:
            self.clip_watch.close()
        self.close()
        self._listeners.clear()

    def __enter__(self) -> Inspector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


@takes_attach_options
def attach(model: nn.Module, scaler: torch.amp.GradScaler | None = None, **options: Any) -> Inspector:
    """Attaches an Inspector to ``model`` (and ``scaler``): see amp_inspect/inspector.py."""
    return Inspector(model, scaler, **options)
