"""check() from one thread only: each call counts a step, so two callers would record every step twice.

The first thread to call is the caller as long as it lives (a loop restarted in a new thread after the old one
ended may take over); a call from another thread while the caller lives, or while a call is running, raises
RuntimeError with the sentence saying why. Costs one uncontended lock per call.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class OneCaller:
    """The thread that calls ``Inspector.check()``, and the lock that refuses a second one at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._caller: threading.Thread | None = None  # the first caller, as long as it lives

    @contextmanager
    def held(self) -> Iterator[None]:
        """The body of one check() call: RuntimeError if another call is running, or another live thread calls."""
        if not self._lock.acquire(blocking=False):
            raise RuntimeError(
                "amp_inspect: check() is already running in another thread; call it from the training loop's "
                "thread only, once per optimizer step"
            )
        try:
            current, caller = threading.current_thread(), self._caller
            if caller is not None and caller is not current and caller.is_alive():
                raise RuntimeError(
                    f"amp_inspect: check() called from thread {current.name!r}, but thread {caller.name!r} calls it "
                    "for this inspector (each call counts a step: two callers would record every step twice); call "
                    "it from the training loop's thread only, or attach another inspector"
                )
            self._caller = current
            yield
        finally:
            self._lock.release()
