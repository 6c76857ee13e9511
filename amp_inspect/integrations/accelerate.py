"""Hugging Face accelerate: a guard on ``accelerator.save_state``. accelerate needs no callback for the
inspection itself (``attach(model, accelerator.scaler)`` after ``prepare``, ``check()`` after
``accelerator.backward(loss)``: docs/usage.md); what it lacks is a word when a checkpoint is written from
NaN/Inf weights. Usage::

    from amp_inspect.integrations import guard_checkpoints

    insp = amp_inspect.attach(model, accelerator.scaler)
    guard_checkpoints(accelerator, insp)      # accelerator.save_state(...) now warns on NaN/Inf weights

Before each ``save_state`` the inspector reads the weights (one fused pass over the parameters, waited for: a
checkpoint is rare) and, when any holds NaN/Inf, warns with a ``PoisonedCheckpointWarning`` that names the step they
became so and where it started (the checkpoint is still written: it is your data). ``accelerator.save_model`` runs
no hooks: call ``insp.checkpoint_warning()`` before it. Returns accelerate's RemovableHandle (``.remove()`` ends it).
"""

from __future__ import annotations

from typing import Any

from amp_inspect.inspection.inspector import Inspector
from amp_inspect.integrations._common import warn_poisoned_checkpoint


def guard_checkpoints(accelerator: Any, inspector: Inspector) -> Any:
    """Warns (PoisonedCheckpointWarning) whenever ``accelerator.save_state`` saves NaN/Inf weights of the model
    ``inspector`` watches; returns the hook's RemovableHandle."""
    register = getattr(accelerator, "register_save_state_pre_hook", None)
    if not callable(register):
        raise TypeError(
            f"guard_checkpoints: {type(accelerator).__name__} has no register_save_state_pre_hook: pass an "
            "accelerate.Accelerator (accelerate >= 0.19)"
        )
    if not isinstance(inspector, Inspector):
        got = type(inspector).__name__
        raise TypeError(f"guard_checkpoints: inspector must be an amp_inspect Inspector, got {got}")

    def before_save(models: list[Any], weights: list[Any], output_dir: str) -> None:
        warn_poisoned_checkpoint(inspector, f"accelerator.save_state({output_dir!r})")

    return register(before_save)
