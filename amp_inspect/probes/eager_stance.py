"""torch.compile's ``force_eager`` stance, held by whoever needs hooks called on a compiled model.

Compiled code does not call module hooks added after compiling (and tracing into them would recompile each time
they come and go), so the activation hooks (probes/_activation_arming.py) and the readiness hooks (readiness/hooks.py)
make torch.compile run eagerly while they are armed. Each holds the stance with ``EagerHold``; the stance is set
when the first holder takes it and put back, to what it was before, when the last one lets go. (Two
``set_stance`` context managers closed in the order they were opened would leave the stance stuck on
``force_eager``: a counted hold, process-wide, releases in any order.)
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

_holders = 0
_stance: ExitStack | None = None


class EagerHold:
    """One holder's claim on the ``force_eager`` stance: ``take()`` and ``release()`` are idempotent."""

    def __init__(self) -> None:
        self.held = False

    def take(self) -> None:
        global _holders, _stance
        if self.held:
            return
        if _holders == 0:
            _stance = ExitStack()
            _stance.enter_context(torch.compiler.set_stance("force_eager"))
        _holders += 1
        self.held = True

    def release(self) -> None:
        global _holders, _stance
        if not self.held:
            return
        self.held = False
        _holders -= 1
        if _holders == 0 and _stance is not None:
            _stance.close()  # the stance from before the first holder
            _stance = None
