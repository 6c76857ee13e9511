"""Hugging Face transformers: a TrainerCallback that inspects every optimizer step of ``Trainer.train``.

Usage::

    from amp_inspect.integrations import AmpInspectTrainerCallback

    trainer = Trainer(model=model, args=args, train_dataset=data)
    cb = AmpInspectTrainerCallback().install(trainer)     # or Trainer(..., callbacks=[cb]): see below
    trainer.train()
    print(cb.inspector.summary())

How the callback finds things (transformers 5.x): callbacks are not given the Trainer. Every event gets
``model`` and ``optimizer`` in its kwargs; ``on_train_begin`` attaches the Inspector to that model, and the
GradScaler is ``optimizer.scaler`` (the Trainer's optimizer is an accelerate ``AcceleratedOptimizer`` after
``accelerator.prepare``, which holds the Accelerator's scaler; None for bf16 and for fp16 on CPU, where
accelerate runs without loss scaling). ``scaler=`` overrides it.

Timing of a Trainer optimizer step: backward, then ``accelerator.clip_grad_norm_`` (it unscales under fp16,
and runs on every step: with ``max_grad_norm=0`` it computes the norm with an infinite max, which still
multiplies the gradients by the clip coefficient), then ``on_pre_optimizer_step``, ``optimizer.step()``,
``on_optimizer_step``, ``zero_grad``, ``on_step_end`` (gradients gone by then), and the log. So:

- ``Trainer(callbacks=[cb])``: the check runs in ``on_pre_optimizer_step`` and judges the *clipped*
  gradients (multiplied back by the loss scale). torch's clipping multiplies every gradient by
  ``max_norm / total_norm``: one NaN makes every gradient NaN (every module an offender), one Inf makes the
  finite gradients zero. Counts of overflow/underflow are those of the clipped gradients.
- ``cb.install(trainer)`` (recommended): the check runs at the start of ``accelerator.clip_grad_norm_``,
  on the gradients as backward left them (scaled under fp16), so NaN/Inf point at the module that made
  them. It also takes the scaler from ``trainer.accelerator.scaler`` and puts the callback first in the
  Trainer's callback list, so that the reporting callbacks (``report_to``) see the keys it adds to the logs.

Logs (``on_log``, one step behind): the keys ``amp_inspect/skipped``, ``loss_scale``, ``total_norm``,
``headroom_up``, ``headroom_down``, ``recommended_scale_log2`` of the newest report the Inspector has
finalized (no host sync: on CUDA normally the previous optimizer step's, on CPU the current one) and
``amp_inspect/skipped_steps``, the skipped steps among the reports finalized since the previous log (without an
enabled GradScaler, as in bf16 runs, nothing is skipped: ``amp_inspect/poisoned`` and ``poisoned_steps`` count
the steps whose NaN/Inf the optimizer applied). They are
added to the ``logs`` dict (seen by the callbacks after this one) and to the entry the Trainer just appended
to ``state.log_history`` (it appends a copy of the logs before calling ``on_log``).

Needs a transformers whose ``TrainerCallback`` has ``on_pre_optimizer_step`` (``pip install
amp_inspect[hf]``). One check per optimizer step, with gradient accumulation too.
"""

from __future__ import annotations

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
    require,
    step_scalars,
    warn_poisoned_checkpoint,
)

transformers = require("transformers", "hf", "AmpInspectTrainerCallback")
if not hasattr(transformers.TrainerCallback, "on_pre_optimizer_step"):
    raise ImportError(
        f"AmpInspectTrainerCallback needs TrainerCallback.on_pre_optimizer_step, which transformers "
        f"{transformers.__version__} lacks: pip install -U amp_inspect[hf]"
    )


def _as_scaler(obj: Any) -> torch.amp.GradScaler | None:
    return obj if isinstance(obj, torch.amp.GradScaler) else None


class AmpInspectTrainerCallback(transformers.TrainerCallback):
    """Attaches an Inspector at train begin, checks each optimizer step and adds its values to the logs.

    Args:
        scaler: the GradScaler to read the loss scale from; None finds it (see the module docstring).
        loggers: amp_inspect loggers (``TensorBoardLogger``, ``WandbLogger``) to attach to the Inspector at
            train begin: they then get every finalized report, histograms included.
        and ``amp_inspect.attach``'s options (amp_inspect/inspection/options.py), for the Inspector attached at train
        begin.

    Example::

        cb = AmpInspectTrainerCallback(formats=("fp16", "bf16")).install(trainer)
        trainer.train()
        [entry["amp_inspect/skipped"] for entry in trainer.state.log_history if "amp_inspect/skipped" in entry]
    """

    @takes_attach_options
    def __init__(
        self, scaler: torch.amp.GradScaler | None = None, *, loggers: Sequence[Any] = (), **options: Any
    ) -> None:
        self.scaler = scaler
        self.options = AttachOptions(**callback_options(options))  # checked now, not at the start of training
        self._given = frozenset(options)  # formats= only when given: else the trainer's autocast dtype decides
        self.loggers = list(loggers)
        self.inspector: Inspector | None = None
        self._follower: ReportFollower | None = None
        self._trainer: Any = None
        self._checked_this_step = False

    def install(self, trainer: Any) -> AmpInspectTrainerCallback:
        """Adds this callback to ``trainer`` first in its callback list and makes it judge the gradients before
        clipping (see the module docstring); returns self. Call once, before ``trainer.train()``."""
        callbacks = trainer.callback_handler.callbacks
        if self in callbacks:
            callbacks.remove(self)
        callbacks.insert(0, self)
        self._trainer = trainer
        accelerator = trainer.accelerator
        if "clip_grad_norm_" not in vars(accelerator):  # not patched yet (a second install keeps the first)
            clip_grad_norm_ = accelerator.clip_grad_norm_

            def check_then_clip(*args: Any, **kwargs: Any) -> Any:
                self._check()
                return clip_grad_norm_(*args, **kwargs)

            accelerator.clip_grad_norm_ = check_then_clip  # instance attribute: uninstall() deletes it
        return self

    def uninstall(self) -> None:
        """Undoes ``install``: removes the callback from the Trainer and the patch of its Accelerator."""
        trainer, self._trainer = self._trainer, None
        if trainer is None:
            return
        if self in trainer.callback_handler.callbacks:
            trainer.callback_handler.callbacks.remove(self)
        if "clip_grad_norm_" in vars(trainer.accelerator):
            del trainer.accelerator.clip_grad_norm_

    def _check(self) -> None:
        if self.inspector is not None and self._follower is not None and not self._checked_this_step:
            self.inspector.check()
            self._checked_this_step = True

    # ---- Trainer events ----

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("AmpInspectTrainerCallback: the Trainer passed no model to on_train_begin")
        scaler = self.scaler
        if scaler is None and self._trainer is not None:
            scaler = _as_scaler(getattr(self._trainer.accelerator, "scaler", None))
        if scaler is None:
            scaler = _as_scaler(getattr(kwargs.get("optimizer"), "scaler", None))
        # update_every: the Trainer's optimizer
        options = attach_kwargs(self.options, kwargs.get("optimizer"), self._given)
        self.inspector = Inspector(model, scaler, **options)
        clip = getattr(args, "max_grad_norm", None)
        if isinstance(clip, (int, float)) and clip > 0:  # the Trainer clips to it (its default: 1.0)
            self.inspector.clip_norm = float(clip)
        self._follower = ReportFollower(self.inspector)
        for logger in self.loggers:
            logger.attach(self.inspector)
        self._checked_this_step = False

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._check()  # no-op when install()'s patch already checked this step, before clipping
        self._checked_this_step = False

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if logs is None or self._follower is None:
            return
        report, skipped_steps = self._follower.take()
        if report is None:
            return
        added = {PREFIX + k: v for k, v in step_scalars(report).items()}
        added[PREFIX + "skipped_steps"] = skipped_steps
        if not report.skips:
            added[PREFIX + "poisoned_steps"] = self._follower.poisoned_taken
        history = state.log_history
        # The Trainer appended {**logs, "step": global_step} just before calling on_log: that entry is this log.
        if history and history[-1].get("step") == state.global_step and all(k in history[-1] for k in logs):
            history[-1].update(added)
        logs.update(added)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After the Trainer saved a checkpoint: a loud warning when its weights hold NaN/Inf (a poisoned run
        otherwise saves, and reports success)."""
        if self.inspector is not None:
            warn_poisoned_checkpoint(self.inspector, f"the checkpoint of step {state.global_step}")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.inspector is not None:
            self.inspector.history  # noqa: B018  # finalize reports in flight (attached loggers get them)
            self.inspector.detach()
        self._follower = None


__all__ = ["AmpInspectTrainerCallback"]
