"""Lightning: a Callback that inspects every optimizer step of ``Trainer.fit``.

Usage::

    import lightning.pytorch as pl
    from amp_inspect.integrations import AmpInspectCallback

    cb = AmpInspectCallback()
    pl.Trainer(precision="16-mixed", callbacks=[cb]).fit(model, data)
    print(cb.inspector.summary())

Timing, as Lightning 2.x runs an automatic-optimization step in its precision plugin: closure (forward,
backward), ``scaler.unscale_(optimizer)`` (16-mixed only), then the ``on_before_optimizer_step`` hooks,
then gradient clipping, then ``scaler.step`` / ``scaler.update``. The check runs in
``on_before_optimizer_step``: after the unscale, before clipping. The Inspector reads the scaler's state
itself and judges the gradients multiplied back by the loss scale, as fp16 saw them; the scaler is the
precision plugin's (``trainer.precision_plugin.scaler``: a GradScaler for "16-mixed", None for
"bf16-mixed" and "32-true", where gradients are judged as stored). With an ``InspectingGradScaler`` as the
plugin's scaler (``MixedPrecision("16-mixed", "cuda", scaler=InspectingGradScaler("cuda"))``) the unscale
pass is the inspection and the check costs nothing more. Fused optimizers, which unscale in their own
step, are judged scaled (the check comes before their step). One check per ``on_before_optimizer_step``:
with several optimizers (manual optimization) each of their steps counts as an inspected step.

Logged with ``pl_module.log`` (on_step only, so the Trainer's loggers get them at ``log_every_n_steps``):
``amp_inspect/skipped``, ``amp_inspect/poisoned`` (without a scaler, e.g. bf16: NaN/Inf applied),
``amp_inspect/total_norm``, ``amp_inspect/loss_scale`` (with a scaler),
``amp_inspect/headroom_up`` / ``headroom_down`` (when defined), from the newest report whose values are on the
host: no host sync. On CPU that is the current step's report (also with an ``InspectingGradScaler``, whose
report reaches the Inspector's history only at ``scaler.update()``, after this hook: it is logged from the
scaler's report directly). On CUDA it is normally the previous step's report, so each logged value is one
step late and the last step's values are not logged (``cb.inspector.history`` and the run log have them).

``cb.inspector`` is the Inspector of the last fit; it is detached at the end of fit (hooks removed) and
keeps its history. Subclass of ``lightning.pytorch.Callback``, or of ``pytorch_lightning.Callback`` when
only that package is installed (``pip install amp_inspect[lightning]``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from amp_inspect.inspection.inspector import Inspector
from amp_inspect.inspection.options import AttachOptions, takes_attach_options
from amp_inspect.integrations._common import (
    PREFIX,
    ReportFollower,
    attach_kwargs,
    callback_options,
    check_every,
    require,
    step_scalars,
    warn_poisoned_checkpoint,
)


def _import_lightning() -> Any:
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return require("pytorch_lightning", "lightning", "AmpInspectCallback")


pl = _import_lightning()

LOGGED_KEYS = ("skipped", "poisoned", "total_norm", "loss_scale", "headroom_up", "headroom_down")


def precision_scaler(trainer: Any) -> torch.amp.GradScaler | None:
    """The GradScaler of the trainer's precision plugin (None for bf16/32-bit precision).

    Example::

        insp = amp_inspect.attach(pl_module, precision_scaler(trainer))   # in a hook of your own
    """
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    return scaler if isinstance(scaler, torch.amp.GradScaler) else None


class AmpInspectCallback(pl.Callback):
    """Attaches an Inspector to the LightningModule at fit start and checks each optimizer step.

    Args:
        log_every: ``pl_module.log`` the scalars every N optimizer steps; 0 logs nothing.
        loggers: amp_inspect loggers (``TensorBoardLogger``, ``WandbLogger``) to attach to the Inspector
            at fit start: they then get every finalized report, histograms included.
        and ``amp_inspect.attach``'s options (amp_inspect/inspection/options.py), for the Inspector attached at fit
        start.

    Example::

        cb = AmpInspectCallback(formats=("fp16", "bf16"), log="amp.jsonl")
        trainer = pl.Trainer(precision="16-mixed", callbacks=[cb])
        trainer.fit(model, data)
        cb.inspector.history[-1].skipped
    """

    @takes_attach_options
    def __init__(self, *, log_every: int = 1, loggers: Sequence[Any] = (), **options: Any) -> None:
        super().__init__()
        self.options = AttachOptions(**callback_options(options))  # checked now, not at the start of training
        self._given = frozenset(options)  # formats= only when given: else the trainer's autocast dtype decides
        self.log_every = check_every("log_every", log_every, allow_zero=True)
        self.loggers = list(loggers)
        self.inspector: Inspector | None = None
        self._follower: ReportFollower | None = None
        self._attached = False
        self._logged_step: int | None = None  # the step whose report was logged last (each is logged once)

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # update_every: the trainer's optimizers
        kwargs = attach_kwargs(self.options, getattr(trainer, "optimizers", None), self._given)
        self.inspector = Inspector(pl_module, precision_scaler(trainer), **kwargs)
        clip = getattr(trainer, "gradient_clip_val", None)
        by_norm = getattr(trainer, "gradient_clip_algorithm", "norm") in (None, "norm")  # Lightning's default
        if isinstance(clip, (int, float)) and clip > 0 and by_norm:
            self.inspector.clip_norm = float(clip)  # Trainer(gradient_clip_val=...) clips the norm to it
        self._follower = ReportFollower(self.inspector)
        self._logged_step = None
        for logger in self.loggers:
            logger.attach(self.inspector)
        self._attached = True

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: torch.optim.Optimizer) -> None:
        if not self._attached or self.inspector is None or self._follower is None:
            return
        returned = self.inspector.check()
        report, _ = self._follower.take()
        # An InspectingGradScaler's report of this step is finalized at scaler.update(), after this hook: log it
        # now when its values are already on the host (CPU), rather than one step late (and the last never).
        if returned is not None and returned.ready() and (report is None or returned.step > report.step):
            report = returned
        if report is None or report.step == self._logged_step:
            return
        self._logged_step = report.step
        if self.log_every == 0 or report.step % self.log_every:
            return
        scalars = step_scalars(report)
        metrics = {PREFIX + k: scalars[k] for k in LOGGED_KEYS if k in scalars}
        pl_module.log_dict(metrics, on_step=True, on_epoch=False, batch_size=1)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        """Before Lightning writes a checkpoint: a loud warning when the weights hold NaN/Inf (a poisoned run
        otherwise saves, and reports success)."""
        if self._attached and self.inspector is not None:
            warn_poisoned_checkpoint(self.inspector, f"the checkpoint of step {trainer.global_step}")

    def _detach(self) -> None:
        if self._attached and self.inspector is not None:
            self.inspector.history  # noqa: B018  # finalize reports in flight (attached loggers get them)
            self.inspector.detach()
        self._attached = False

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._detach()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._detach()


__all__ = ["AmpInspectCallback", "precision_scaler"]
