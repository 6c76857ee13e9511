"""When an inspector's activation hooks are armed (probes/activations.py holds the hooks themselves).

- ``activations="always"``: armed from attach to detach.
- ``activations="on_skip"``: armed after a skipped (or poisoned) step, from the next forward, for ``arm_steps``
  steps; the findings name the first module whose output or output gradient went non-finite.
- ``activations="off"``: never (no hooks are made).

On a torch.compile'd model, compiled code does not call hooks added after compiling (and tracing into them
recompiles every step): while armed, torch.compile runs eagerly (``torch.compiler.set_stance("force_eager")``),
and the stance before is put back on disarming. A whole armed step without one module's forward recorded means
the hooks were bypassed: the finding says so rather than stay silently empty.
"""

from __future__ import annotations

import warnings

from torch import nn

from amp_inspect.gradients.step_report import StepReport
from amp_inspect.model.view import ModelView
from amp_inspect.probes.activations import ActivationWatcher
from amp_inspect.probes.eager_stance import EagerHold
from amp_inspect.probes.probe import NOTHING, ReportParts

# No commas: the HTML report lists findings up to their first comma.
NO_FORWARD_SEEN = (
    "not searched: the armed activation hooks saw no forward pass in this step (does the loop call a "
    "torch.compile wrapper that the inspector was not attached to? Compiled code does not call hooks added after "
    "compiling: attach the compiled model itself)"
)


class ActivationArming:
    """An inspector's activation hooks (``watcher``, None with ``activations="off"``) and when they are armed.
    ``owner``: the inspector; the hooks leave the model when it is dropped without detach()."""

    def __init__(
        self,
        model: nn.Module | ModelView,
        mode: str,
        arm_steps: int,
        formats: tuple[str, ...],
        owner: object,
        step: int,
    ) -> None:
        view = ModelView.of(model)
        self.mode = mode
        self.arm_steps = arm_steps
        self._compiled = mode != "off" and view.compiled
        if self._compiled and mode == "always":
            warnings.warn(
                "amp_inspect: activations='always' on a torch.compile'd model runs every step eagerly (compiled code "
                "does not call the activation hooks); use activations='on_skip' to run eagerly only for a few steps "
                "after a skipped step",
                RuntimeWarning,
                stacklevel=5,  # the caller of attach()
            )
        self._eager = EagerHold()  # the force_eager stance while armed (probes/eager_stance.py), let go on disarming
        self._armed_until = -1
        self._findings: dict[int, str] = {}  # findings of steps that had no report yet
        self._warned_no_forward = False
        self.watcher = ActivationWatcher(view.root, names=view.names, formats=formats) if mode != "off" else None
        if self.watcher is not None:
            self.watcher.close_when_dropped(owner)
            if mode == "always":
                self._arm()
                self.watcher.new_step(step)

    def set_formats(self, formats: tuple[str, ...]) -> None:
        if self.watcher is not None:
            self.watcher.formats = formats

    def rename(self, view: ModelView) -> None:
        """The model's modules changed (added, wrapped or moved in place; ``view`` refreshed): watch them under
        their new names."""
        if self.watcher is None:
            return
        was_armed = self.watcher.armed
        self._disarm()
        self.watcher.names = dict(view.names)
        if was_armed:
            self._arm()

    def take_finding(self, step: int) -> str | None:
        """The finding of ``step`` made before its report existed (a skip under every=N), once."""
        return self._findings.pop(step, None)

    # The Probe protocol (probes/probe.py).

    def annotate(self, report: StepReport) -> ReportParts:
        """``report``'s part: the finding of its step made before it existed, unless it carries one of its own."""
        if report.first_nonfinite is not None:
            return NOTHING
        finding = self.take_finding(report.step)
        return NOTHING if finding is None else {"first_nonfinite": finding}

    def end_step(self, next_step: int, report: StepReport | None, optimizer_done: bool = False) -> ReportParts:
        """The step before ``next_step`` ended: its finding goes to ``report`` (the last one made) when that is
        the step's, else it waits for the step's report; then the hooks are disarmed or start the next step.
        Reading the hooks' statistics syncs (armed steps only)."""
        watcher = self.watcher
        if watcher is None or not watcher.armed:
            return NOTHING
        part: ReportParts = NOTHING
        finding: object = watcher.first_finding()
        step = next_step - 1  # the step whose forward and backward the hooks saw
        if finding is None and watcher.step == step and watcher.names and not watcher.records:
            finding = NO_FORWARD_SEEN
            if not self._warned_no_forward:
                self._warned_no_forward = True
                warnings.warn(f"amp_inspect: first non-finite producer {NO_FORWARD_SEEN}", RuntimeWarning, stacklevel=5)
        if finding is not None:
            if report is not None and report.step == step:
                if report.first_nonfinite is None:
                    part = {"first_nonfinite": str(finding)}
            else:
                self._findings = {s: f for s, f in self._findings.items() if s >= step - self.arm_steps}
                self._findings[step] = str(finding)
        if self.mode == "on_skip" and next_step > self._armed_until:
            self._disarm()
        else:
            watcher.new_step(next_step)
        return part

    def after_skip(self, next_step: int) -> None:
        """A skipped or poisoned step was finalized: with ``on_skip``, armed from ``next_step`` for arm_steps."""
        if self.watcher is None or self.mode != "on_skip":
            return
        self._armed_until = next_step + self.arm_steps - 1
        if not self.watcher.armed:
            self._arm()
            self.watcher.new_step(next_step)

    def close(self) -> None:
        """Disarms for good: a later step does not re-arm, hooks on model copies go quiet."""
        if self.watcher is not None:
            self._disarm()
            self.watcher.close()

    def _arm(self) -> None:
        assert self.watcher is not None
        if self._compiled:
            self._eager.take()
        self.watcher.arm()

    def _disarm(self) -> None:
        assert self.watcher is not None
        self.watcher.disarm()
        self._eager.release()  # the stance before arming, once no other holder needs it
