"""thread_guard.OneCaller: one thread calls check(); a second one, at once or later while the first lives, is
refused; a thread that ended hands over."""

from __future__ import annotations

import functools
import sys
import threading
from types import FrameType

import pytest

from amp_inspect.inspection._thread_guard import OneCaller


def _in_thread(body) -> BaseException | None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            body()
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            errors.append(error)

    worker = threading.Thread(target=run, name="other")
    worker.start()
    worker.join(timeout=30)
    return errors[0] if errors else None


def _call(guard: OneCaller) -> None:
    with guard:
        pass


def test_a_second_caller_while_one_is_inside_is_refused() -> None:
    guard = OneCaller()
    with guard:
        error = _in_thread(functools.partial(_call, guard))
    assert isinstance(error, RuntimeError) and "already running in another thread" in str(error)


def test_a_live_first_caller_keeps_the_call_and_an_ended_one_hands_it_over() -> None:
    guard = OneCaller()
    _call(guard)
    error = _in_thread(functools.partial(_call, guard))  # this thread, the first caller, is alive
    assert isinstance(error, RuntimeError) and "but thread 'MainThread' calls it" in str(error)
    other = OneCaller()
    assert _in_thread(lambda: _call(other)) is None  # the first caller: a thread that ends
    _call(other)  # that thread ended: this one takes over


def test_an_error_inside_releases_the_lock() -> None:
    guard = OneCaller()
    with pytest.raises(ValueError), guard:
        raise ValueError("inside")
    _call(guard)


def _interrupt_at(opcode: int, body) -> bool:
    """Runs body with a KeyboardInterrupt raised before the guard's opcode-th bytecode (counted over the
    guard module's frames, entering and leaving), as Ctrl-C may land there; True if it landed."""
    seen = 0
    landed = False
    guard_file = sys.modules[OneCaller.__module__].__file__

    def trace(frame: FrameType, event: str, arg: object):
        nonlocal seen, landed
        if frame.f_code.co_filename != guard_file:
            return None
        frame.f_trace_opcodes = True
        if event == "opcode":
            seen += 1
            if seen == opcode:
                landed = True
                raise KeyboardInterrupt
        return trace

    sys.settrace(trace)
    try:
        body()
    except KeyboardInterrupt:
        pass
    finally:
        sys.settrace(None)
    return landed


def test_an_interrupt_at_any_bytecode_of_the_guard_leaves_later_calls_free() -> None:
    # Ctrl-C while the guard was being entered left its lock held: every later check() of the one-thread loop
    # said "already running in another thread" (seen on the old, lock-based guard at 7 of its 37 bytecodes).
    positions = 0
    for opcode in range(1, 10_000):
        guard = OneCaller()
        _call(guard)  # this thread is the caller
        if not _interrupt_at(opcode, functools.partial(_call, guard)):
            break  # past the guard's last bytecode: every position was tried
        positions += 1
        _call(guard)  # the next call of the same loop runs
        assert _in_thread(functools.partial(_call, guard)) is not None  # and a second thread is still refused
    assert positions > 10


def test_an_interrupted_check_lets_the_next_check_run() -> None:
    import torch

    import amp_inspect

    model = torch.nn.Linear(4, 4)
    insp = amp_inspect.attach(model)
    try:
        model(torch.ones(2, 4)).sum().backward()
        landed = _interrupt_at(3, insp.check)
        assert landed
        insp.check()
        insp.check()
        assert insp.last_report is not None and insp.last_report.step == insp.step - 1
    finally:
        insp.detach()
