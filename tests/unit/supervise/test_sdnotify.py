"""sd_notify(3) details the daemon relies on: abstract socket addresses and WATCHDOG_PID."""

from __future__ import annotations

import os
import socket
import uuid

import pytest

from prefetchd.supervise.sdnotify import notify, watchdog_interval


def test_notify_without_systemd_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert notify("READY=1") is False


def test_notify_reaches_an_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"prefetchd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert notify("READY=1") is True
        assert sock.recv(100) == b"READY=1"


def test_watchdog_interval_is_half_of_watchdogsec_for_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "120000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    assert watchdog_interval() == 60.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert watchdog_interval() == 60.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert watchdog_interval() is None
    monkeypatch.delenv("WATCHDOG_USEC")
    assert watchdog_interval() is None
