"""thread_guard.OneCaller: one thread calls check(); a second one, at once or later while the first lives, is
refused; a thread that ended hands over."""

from __future__ import annotations

import threading

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
    with guard.held():
        pass


def test_a_second_caller_while_one_is_inside_is_refused() -> None:
    guard = OneCaller()
    with guard.held():
        error = _in_thread(lambda: _call(guard))
    assert isinstance(error, RuntimeError) and "already running in another thread" in str(error)


def test_a_live_first_caller_keeps_the_call_and_an_ended_one_hands_it_over() -> None:
    guard = OneCaller()
    _call(guard)
    error = _in_thread(lambda: _call(guard))  # this thread, the first caller, is alive
    assert isinstance(error, RuntimeError) and "but thread 'MainThread' calls it" in str(error)
    other = OneCaller()
    assert _in_thread(lambda: _call(other)) is None  # the first caller: a thread that ends
    _call(other)  # that thread ended: this one takes over


def test_an_error_inside_releases_the_lock() -> None:
    guard = OneCaller()
    with pytest.raises(ValueError), guard.held():
        raise ValueError("inside")
    _call(guard)
