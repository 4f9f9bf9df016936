"""The done flag of a call handed to the connection's holder (``_io._Done``); no broker."""

from __future__ import annotations

import threading
import time

from ackwise_rabbitmq._calls import _Done


def test_a_wait_returns_when_another_thread_sets_it() -> None:
    done = _Done()
    threading.Timer(0.05, done.set).start()
    started = time.monotonic()
    assert done.wait(5.0)
    assert time.monotonic() - started < 2.0
    assert done.is_set()


def test_a_wait_times_out_while_not_set() -> None:
    done = _Done()
    assert not done.wait(0.01)
    assert not done.is_set()


def test_setting_it_again_is_a_no_op() -> None:
    done = _Done()
    done.set()
    done.set()
    assert done.wait(0.0)
    assert done.wait(0.0)  # and it stays set


def test_two_threads_setting_it_at_once_raise_nothing() -> None:
    errors: list[BaseException] = []
    for _ in range(200):
        done = _Done()
        start = threading.Barrier(2)

        def setter(d: _Done = done, b: threading.Barrier = start) -> None:
            b.wait()
            try:
                d.set()
            except BaseException as exc:  # pragma: no cover - the failure this guards
                errors.append(exc)

        threads = [threading.Thread(target=setter) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert done.wait(0.0)
    assert errors == []
