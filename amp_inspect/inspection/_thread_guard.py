"""check() from one thread only: each call counts a step, so two callers would record every step twice.

The first thread to call is the caller as long as it lives (a loop restarted in a new thread after the old one
ended may take over); a call from another thread while the caller lives, or while a call is running, raises
RuntimeError with the sentence saying why. Costs one dict operation per call.

A KeyboardInterrupt may land between any two bytecodes, also while the guard is being taken or given back.
A lock taken there and never released would refuse every later call of the same loop ("already running in
another thread"). So the running call is marked by the thread's id in a dict slot, taken and freed by single
C calls: a mark left behind by an interrupted call is this thread's own, and its next call takes it over.
"""

from __future__ import annotations

import threading
from types import TracebackType

_RUNNING = "running"  # the slot's key: the id of the thread inside check()


class OneCaller:
    """The thread that calls ``Inspector.check()``, and the mark that refuses a second one at once.

    ``with guard:`` is the body of one check() call: RuntimeError if another thread's call is running, or
    another live thread calls. A call from inside a running call on the same thread is not told apart from
    a mark an interrupt left behind, and is let in.
    """

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}  # _RUNNING -> thread id, while a call runs (or an interrupt left it)
        self._caller: threading.Thread | None = None  # the first caller, as long as it lives

    def __enter__(self) -> None:
        me = threading.get_ident()
        # setdefault takes a free slot, or reads who holds it, in one step no other thread can split.
        if self._slot.setdefault(_RUNNING, me) != me:
            raise RuntimeError(
                "amp_inspect: check() is already running in another thread; call it from the training loop's "
                "thread only, once per optimizer step"
            )
        current, caller = threading.current_thread(), self._caller
        if caller is not None and caller is not current and caller.is_alive():
            self._slot.pop(_RUNNING, None)
            raise RuntimeError(
                f"amp_inspect: check() called from thread {current.name!r}, but thread {caller.name!r} calls it "
                "for this inspector (each call counts a step: two callers would record every step twice); call "
                "it from the training loop's thread only, or attach another inspector"
            )
        self._caller = current

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._slot.pop(_RUNNING, None)
