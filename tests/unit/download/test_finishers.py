"""The crt transfer's finisher threads (``download/finishers.py``): every object handed to them is
finished once, also those queued when the transfer shuts down, and a late one is refused."""

from __future__ import annotations

import logging
import threading

import pytest

from prefetchd.download.finishers import Finishers


def test_every_call_submitted_before_shutdown_runs_once() -> None:
    done: list[int] = []
    lock = threading.Lock()

    def finish(item: int) -> None:
        with lock:
            done.append(item)

    pool: Finishers[int] = Finishers(4, "test")
    for item in range(500):
        pool.submit(finish, item)
    pool.shutdown()  # returns once the queued calls ran: nothing is dropped on stop
    assert sorted(done) == list(range(500))


def test_a_call_after_shutdown_is_refused_so_the_caller_runs_it_itself() -> None:
    pool: Finishers[int] = Finishers(2, "test")
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(lambda item: None, 1)


def test_a_failing_call_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done: list[int] = []

    def finish(item: int) -> None:
        if item == 3:
            raise ValueError("broken object")
        done.append(item)

    pool: Finishers[int] = Finishers(1, "test")
    with caplog.at_level(logging.ERROR):
        for item in range(6):
            pool.submit(finish, item)
        pool.shutdown()
    assert done == [0, 1, 2, 4, 5]
    assert "broken object" in caplog.text
