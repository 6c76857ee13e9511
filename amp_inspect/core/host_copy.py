"""Device tensors on their way to the host without a sync: what reports (and the DDP hook's records) read one
step behind on CUDA."""

from __future__ import annotations

import numpy as np
import torch


class HostCopy:
    """Device tensors on their way to the host: on CUDA, copied into pinned memory with non-blocking copies
    and an event, so nothing waits until ``host()`` is called or ``ready()`` says so."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device) -> None:
        self._event = None
        if device.type == "cuda":
            pinned = {}
            for name, t in tensors.items():
                buffer = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                buffer.copy_(t, non_blocking=True)
                pinned[name] = buffer
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(device))
            tensors = pinned
        self._tensors = tensors
        self._host: dict[str, np.ndarray] | None = None

    def ready(self) -> bool:
        """Whether the host copy is complete (never waits)."""
        if self._event is not None and self._event.query():
            self._event = None  # complete: host() needs no synchronize
        return self._event is None

    def host(self) -> dict[str, np.ndarray]:
        """The tensors as numpy arrays; waits for the copy on CUDA (the first call only)."""
        if self._host is None:
            if self._event is not None:
                self._event.synchronize()
                self._event = None
            self._host = {name: t.numpy() for name, t in self._tensors.items()}
        return self._host
