"""Integrations with training frameworks and experiment trackers, each in its own module:

- ``TensorBoardLogger`` (amp_inspect.integrations.tensorboard; ``pip install amp_inspect[tensorboard]``)
- ``WandbLogger`` (amp_inspect.integrations.wandb; ``pip install amp_inspect[wandb]``)
- ``AmpInspectCallback`` for Lightning (amp_inspect.integrations.lightning; ``pip install amp_inspect[lightning]``)
- ``AmpInspectTrainerCallback`` for transformers' Trainer (amp_inspect.integrations.hf; ``pip install amp_inspect[hf]``)
- ``guard_checkpoints`` for accelerate's ``save_state`` (amp_inspect.integrations.accelerate; ``[accelerate]``)

Importing this package imports none of those packages: each name is imported on first use, and a missing
package raises an ImportError that names the extra to install. Usage::

    from amp_inspect.integrations import TensorBoardLogger

    TensorBoardLogger("runs/amp").attach(amp_inspect.attach(model, scaler))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amp_inspect._lazy import lazy_names

if TYPE_CHECKING:
    from amp_inspect.integrations.accelerate import guard_checkpoints
    from amp_inspect.integrations.hf import AmpInspectTrainerCallback
    from amp_inspect.integrations.lightning import AmpInspectCallback
    from amp_inspect.integrations.tensorboard import TensorBoardLogger
    from amp_inspect.integrations.wandb import WandbLogger

_MODULE_OF = {
    "TensorBoardLogger": "tensorboard",
    "WandbLogger": "wandb",
    "AmpInspectCallback": "lightning",
    "AmpInspectTrainerCallback": "hf",
    "guard_checkpoints": "accelerate",
}

__all__ = ["AmpInspectCallback", "AmpInspectTrainerCallback", "TensorBoardLogger", "WandbLogger", "guard_checkpoints"]


__getattr__, __dir__ = lazy_names(__name__, _MODULE_OF)
