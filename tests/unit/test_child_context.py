"""A child's loop learns that the supervisor is gone without a syscall on every pass.

``ChildContext.should_stop`` is called once per pass of the downloader's and the writers'
loops: about once per small object in the downloader. Whether the parent is still there
(``getppid``) is asked at most every ``PARENT_CHECK_INTERVAL`` of the loop's clock, counted
here with a clock that moves only when the test says so.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefetchd.child import context
from prefetchd.child.context import PARENT_CHECK_INTERVAL, ChildContext
from tests.unit.configs import unit_config


class Clock:
    """``time`` for the context module: ``monotonic`` moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


def test_the_parent_is_looked_at_once_per_interval_not_once_per_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(context, "time", clock)
    parent = os.getppid()
    ctx = ChildContext("downloader", unit_config(tmp_path))
    calls = 0

    def getppid() -> int:
        nonlocal calls
        calls += 1
        return parent

    monkeypatch.setattr(os, "getppid", getppid)
    for _ in range(10_000):  # a busy loop's passes within one interval: no syscall
        assert not ctx.should_stop()
    assert calls == 0
    for _ in range(50):  # one look per interval, however many passes
        clock.now += PARENT_CHECK_INTERVAL
        for _ in range(100):
            assert not ctx.should_stop()
    assert calls == 50


def test_a_child_whose_supervisor_is_gone_stops_within_an_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    monkeypatch.setattr(context, "time", clock)
    ctx = ChildContext("writer-0", unit_config(tmp_path))
    monkeypatch.setattr(os, "getppid", lambda: 1)  # adopted by init: the parent died
    assert not ctx.should_stop()  # not looked at yet this interval
    clock.now += PARENT_CHECK_INTERVAL
    assert ctx.should_stop()
    assert ctx.stopping
    assert ctx.should_stop()  # and stays stopped


def test_a_stop_signal_stops_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "time", Clock())
    ctx = ChildContext("downloader", unit_config(tmp_path))
    ctx.on_stop_signal(15, None)
    assert ctx.should_stop()
