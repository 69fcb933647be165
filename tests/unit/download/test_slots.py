"""The crt transfer's request slots (``download/slots.py``): never more taken than there are, a
release from another thread wakes a waiting taker, and an empty wait ends at its timeout."""

from __future__ import annotations

import threading

from prefetchd.download.adaptive import AdaptiveLimit
from prefetchd.download.slots import Slots


def test_no_more_slots_are_taken_than_there_are() -> None:
    slots = Slots(3)
    assert [slots.acquire(timeout=0) for _ in range(4)] == [True, True, True, False]
    slots.release(2)
    assert [slots.acquire(timeout=0) for _ in range(3)] == [True, True, False]


def test_a_release_from_another_thread_wakes_the_taker() -> None:
    slots = Slots(1)
    assert slots.acquire(timeout=0)
    releaser = threading.Timer(0.05, slots.release, args=(1,))
    releaser.start()
    try:
        assert slots.acquire(timeout=30)  # returns on the release, long before the timeout
    finally:
        releaser.join()


def test_a_wait_with_nothing_released_ends_at_its_timeout() -> None:
    slots = Slots(1)
    assert slots.acquire(timeout=0)
    assert not slots.acquire(timeout=0.01)


def test_many_threads_releasing_give_back_every_slot() -> None:
    slots = Slots(64)
    for _ in range(64):
        assert slots.acquire(timeout=0)
    threads = [threading.Thread(target=slots.release, args=(1,)) for _ in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(slots.acquire(timeout=0) for _ in range(65)) == 64


def test_extra_slots_open_only_while_the_adaptive_limit_is_at_its_ceiling() -> None:
    """The native client queues ``extra`` requests beyond the wire's limit in its engine; once
    the store throttles, the limit bounds every request taken, queued or not."""
    limit = AdaptiveLimit(4, clock=lambda: 100.0)
    slots = Slots(6, limit, extra=2)
    assert [slots.acquire(timeout=0) for _ in range(7)] == [True] * 6 + [False]
    slots.release(6)
    limit.throttle()  # 4 -> 2
    assert limit.allowed == 2
    assert [slots.acquire(timeout=0) for _ in range(3)] == [True, True, False]
