"""The request path's pure parts: the budgets (token buckets), adaptive concurrency (AIMD), the
store's health, the slots that keep the limit, the fleet's stagger and the retry hook."""

from __future__ import annotations

from typing import Any

import botocore.exceptions
import pytest

from prefetchd.config import config_from_dict
from prefetchd.download import hooks
from prefetchd.download.adaptive import COOLDOWN, GROW_EVERY, AdaptiveLimit
from prefetchd.download.health import OUTAGE_ERRORS, StoreHealth
from prefetchd.download.pacing import Pacer, TokenBucket
from prefetchd.download.signals import Signals
from prefetchd.download.slots import Slots
from prefetchd.download.stagger import MAX_SPREAD, start_delay


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_request_budget_lets_through_its_rate_over_any_stretch() -> None:
    clock = Clock()
    pacer = Pacer(10, None, clock)
    started = 0
    for _ in range(3000):  # 30 s in steps of 10 ms
        while pacer.delay(1, 0) == 0:
            started += 1
        clock.now += 0.01
    assert 300 <= started <= 10 * (30 + 1) + 1  # rate x (T + 1): one second's burst


def test_a_byte_budget_lets_a_large_object_through_and_the_next_waits_its_debt() -> None:
    clock = Clock()
    bucket = TokenBucket(10 * 2**20, clock)
    assert bucket.delay(64 * 2**20) == 0  # never stuck behind a cost above the capacity
    assert bucket.delay(1) == pytest.approx(5.4, abs=0.01)  # 54 MiB of debt at 10 MiB/s
    clock.now += 5.4
    assert bucket.delay(1) == 0


def test_without_budgets_the_pacer_never_holds_a_request() -> None:
    pacer = Pacer(None, None)
    assert not pacer.active
    assert pacer.delay(10**6, 10**12) == 0


def test_throttling_halves_the_limit_once_per_cooldown_and_successes_grow_it_back() -> None:
    clock = Clock()
    limit = AdaptiveLimit(32, clock)
    for _ in range(20):  # a burst of 503s from requests already in flight: one cut
        limit.throttle()
    assert limit.allowed == 16 and limit.throttled == 20
    clock.now += COOLDOWN
    limit.throttle()
    clock.now += COOLDOWN
    limit.throttle()
    assert limit.allowed == 4
    for _ in range(1000):  # many successes within one cooldown: one step, not a thousand
        limit.success()
    assert limit.allowed == 4
    for _ in range(4):  # one step up every GROW_EVERY
        clock.now += GROW_EVERY
        limit.success()
    assert limit.allowed == 8
    for _ in range(100):
        clock.now += GROW_EVERY
        limit.success()
    assert limit.allowed == 32  # never above download.concurrency


def test_the_limit_never_drops_below_one_request() -> None:
    clock = Clock()
    limit = AdaptiveLimit(4, clock)
    for _ in range(10):
        limit.throttle()
        clock.now += COOLDOWN
    assert limit.allowed == 1


def test_slots_keep_the_adaptive_limit() -> None:
    limit = AdaptiveLimit(8, Clock())
    slots = Slots(8, limit)
    assert all(slots.acquire(0) for _ in range(8))
    limit.throttle()  # 8 -> 4 while 8 are in flight
    slots.release(3)
    assert not slots.acquire(0), "5 in flight, 4 allowed"
    slots.release(2)
    assert slots.acquire(0) and not slots.acquire(0)  # 3 in flight + 1 = 4
    assert slots.in_use == 4


def test_an_outage_needs_failures_in_a_row_and_is_dated_from_the_first() -> None:
    clock = Clock()
    health = StoreHealth(clock)
    for _ in range(OUTAGE_ERRORS - 1):
        health.failed("connection reset")
        clock.now += 1
    assert health.outage() is None
    health.failed("connection refused")
    outage = health.outage()
    assert outage is not None
    assert (outage.since, outage.errors, outage.last) == (100.0, 3, "connection refused")
    health.answered()
    assert health.outage() is None and health.outages == 1


def test_a_single_host_never_waits_and_a_fleet_is_spread_evenly_and_bounded() -> None:
    def delay(n: int, i: int) -> float:
        data = {
            "source": {"url": "s3://bucket/prefix/"},
            "sharding": {"num_workers": n, "worker_index": i},
        }
        return start_delay(config_from_dict(data))

    assert delay(1, 0) == 0
    assert delay(8, 0) == 0
    eight = [delay(8, i) for i in range(8)]
    assert eight == sorted(eight) and len(set(eight)) == 8 and eight[-1] < 1
    assert delay(100, 50) == delay(100, 50)  # the same on every run
    assert max(delay(5000, i) for i in range(0, 5000, 7)) < MAX_SPREAD


def _signals() -> Signals:
    data = {"source": {"url": "s3://bucket/prefix/"}, "download": {"concurrency": 16}}
    return Signals.of(config_from_dict(data))


class _Http:
    def __init__(self, status: int) -> None:
        self.status_code = status


def _answer(status: int, code: str = "") -> Any:
    return (_Http(status), {"Error": {"Code": code}} if code else {})


def test_the_retry_hook_cuts_the_limit_on_slowdown_and_caps_the_delay() -> None:
    signals = _signals()
    for attempt in range(1, 11):
        delay = hooks._needs_retry(signals, 11, attempts=attempt, response=_answer(503, "SlowDown"))
        assert delay is not None and 0 <= delay <= hooks.MAX_RETRY_DELAY
    assert signals.limit.allowed == 8 and signals.limit.throttled == 10
    assert signals.health.outage() is None, "throttling is not an outage"
    # the last attempt: botocore decides (no retry)
    assert hooks._needs_retry(signals, 11, attempts=11, response=_answer(503, "SlowDown")) is None


def test_the_retry_hook_counts_dropped_connections_and_an_answer_ends_them() -> None:
    signals = _signals()
    reset = botocore.exceptions.ConnectionClosedError(
        endpoint_url="http://127.0.0.1:1/b/k",
        error=ConnectionResetError(104, "Connection reset by peer"),
    )
    for attempt in range(1, 4):
        assert hooks._needs_retry(signals, 11, attempts=attempt, caught_exception=reset) is not None
    outage = signals.health.outage()
    assert outage is not None and outage.last == "connection reset"
    assert hooks._needs_retry(signals, 11, attempts=4, response=_answer(404, "NoSuchKey")) is None
    assert signals.health.outage() is None  # a 404 is an answer: the store is there


def test_below_one_request_in_flight_the_rule_goes_on_with_a_rate_then_lifts_it() -> None:
    clock = Clock()
    limit = AdaptiveLimit(2, clock)
    pacer = Pacer(None, None, clock, limit=limit)
    limit.throttle()  # 2 -> 1
    assert limit.allowed == 1 and limit.rate is None and not pacer.active
    for _ in range(40):  # one request in flight still sends 40 a second
        clock.now += 1 / 40
        limit.throttle()
    assert limit.rate == pytest.approx(20, rel=0.05)  # half what it sent
    assert pacer.active
    started = 0
    for _ in range(1000):  # 10 s: evenly spaced at the rate, one more each GROW_EVERY
        if pacer.delay(1, 0) == 0:
            started += 1
            limit.success()
        clock.now += 0.01
    assert 200 <= started <= 20 * 10 + 10 * 10 / GROW_EVERY / 2 + 2
    for _ in range(200):
        clock.now += GROW_EVERY
        limit.success()
    assert limit.rate is None, "lifted once back at twice what one request in flight sent"
    assert not pacer.active and limit.allowed == 2


def test_admit_never_blocks_past_its_timeout_and_counts_the_time_held_back() -> None:
    clock = Clock()
    pacer = Pacer(1.0, None, clock)
    assert pacer.admit(2, 0, timeout=0)  # the bucket's one token, then a debt of one
    assert not pacer.admit(1, 0, timeout=0)
    clock.now += 0.5
    assert not pacer.admit(1, 0, timeout=0)
    clock.now += 0.5
    assert pacer.admit(1, 0, timeout=0)
    assert pacer.waited_s == pytest.approx(1.0)
