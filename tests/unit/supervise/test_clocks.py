"""Regression: heartbeats and grace periods followed the wall clock, so an NTP step of an hour
got healthy children SIGKILLed, made ``prefetchd status`` call a live daemon "not running" and
expired a trainer's grace. Every one of them now reads time.monotonic(); the wall clock is
stepped here (time.time patched) while the monotonic clock moves on normally."""

from __future__ import annotations

import json
import os
import time

import pytest

from prefetchd.consume.health import DaemonHealth
from prefetchd.errors import DaemonFailed
from prefetchd.layout import Layout
from prefetchd.messages.child_report import ChildReport
from prefetchd.messages.status_record import StatusRecord
from prefetchd.supervise.children import HEARTBEAT_TIMEOUT, Child, Clock, Lifecycle
from prefetchd.supervise.status import is_running
from tests.unit.supervise.test_supervisor_children import ROLE, FakeProcess

HOUR = 3600.0


def step_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


@pytest.mark.parametrize("step", [HOUR, -HOUR])
def test_a_wall_clock_step_does_not_kill_a_child_that_keeps_reporting(
    monkeypatch: pytest.MonkeyPatch, step: float
) -> None:
    now = [1000.0]
    spawned: list[FakeProcess] = []

    def spawn(child: Child) -> FakeProcess:
        spawned.append(FakeProcess(100 + len(spawned), obeys_sigterm=True))
        return spawned[-1]

    life = Lifecycle([Child(ROLE, 0)], spawn, Clock(monotonic=lambda: now[0]))
    life.start_all()
    (child,) = life.children
    assert child.pid is not None
    child.last_report = ChildReport(pid=child.pid, ready=True, heartbeat=time.time(), beat=now[0])
    life.mark_ready()
    step_wall_clock(monkeypatch, step)
    now[0] += 1.0  # one second later by the monotonic clock
    life.kill_hung()
    assert spawned[0].received == [], "a child that reported a second ago is not hung"
    now[0] += HEARTBEAT_TIMEOUT + 1  # ... but real silence is still noticed
    life.kill_hung()
    assert spawned[0].received == ["SIGKILL"]


def write_status(layout: Layout, **fields: object) -> None:
    record = StatusRecord(
        state="running",
        pid=os.getpid(),
        updated=time.time(),
        updated_monotonic=time.monotonic(),
    )
    data = {**json.loads(record.encode()), **fields}
    layout.status_file.write_text(json.dumps(data), encoding="utf-8")


def test_a_wall_clock_step_does_not_make_a_live_daemon_look_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = StatusRecord(state="running", updated=time.time(), updated_monotonic=time.monotonic())
    step_wall_clock(monkeypatch, HOUR)
    assert record.age() < 5
    step_wall_clock(monkeypatch, -2 * HOUR)
    assert record.age() < 5
    assert not is_running(StatusRecord(state="running", pid=0)), "no pid: not running"


def test_a_status_without_a_monotonic_time_is_aged_by_the_wall_clock() -> None:
    """An older daemon's record (no ``updated_monotonic``), or one from before a reboot."""
    old = StatusRecord(state="running", updated=time.time() - 100)
    assert old.age() == pytest.approx(100, abs=5)
    ahead = StatusRecord(state="running", updated=time.time() - 100, updated_monotonic=1e12)
    assert ahead.age() == pytest.approx(100, abs=5)


def test_a_wall_clock_step_does_not_expire_a_trainers_grace(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [500.0]
    health = DaemonHealth(layout, grace=60, monotonic=lambda: now[0])
    write_status(layout)
    health.check()
    step_wall_clock(monkeypatch, HOUR)
    now[0] += 30
    write_status(layout)  # the daemon goes on writing, its `updated` an hour ahead
    health.check()
    step_wall_clock(monkeypatch, -HOUR)  # and back
    now[0] += 30
    write_status(layout)
    health.check()


def test_a_daemon_that_stops_writing_status_still_expires_the_grace(layout: Layout) -> None:
    now = [500.0]
    health = DaemonHealth(layout, grace=60, monotonic=lambda: now[0])
    write_status(layout)
    health.check()
    now[0] += 59
    health.check()
    now[0] += 2
    with pytest.raises(DaemonFailed, match="gone for more than 60 s"):
        health.check()


def test_a_trainer_started_after_the_job_finished_is_told_so_after_the_grace(
    layout: Layout,
) -> None:
    """Its fence is stale, so the trainer waits for a daemon; none comes: the error says the
    job finished and what to do, not that the daemon failed."""
    now = [500.0]
    write_status(layout, state="done", updated=time.time() - HOUR)
    health = DaemonHealth(layout, grace=60, monotonic=lambda: now[0])
    health.check()
    now[0] += 61
    with pytest.raises(DaemonFailed, match=r"finished its job at .* start `prefetchd run`"):
        health.check()
