"""The systemd notify protocol, spoken to a datagram socket this test owns, as systemd would
see it from ``Type=notify`` and ``WatchdogSec=`` (systemd/prefetchd@.service)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e

KIB = 1024


class NotifySocket:
    """A bound AF_UNIX datagram socket collecting sd_notify messages in arrival order."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.messages: list[tuple[float, str]] = []

    def poll(self, seconds: float) -> None:
        """Collect what arrives during ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                return
            for line in data.decode().splitlines():
                self.messages.append((time.monotonic(), line))

    def wait_for(self, message: str, timeout: float) -> float:
        """When ``message`` arrived (waiting up to ``timeout`` s for it); fails the test if not."""
        deadline = time.monotonic() + timeout
        while True:
            for when, line in self.messages:
                if line == message:
                    return when
            if time.monotonic() > deadline:
                got = sorted({m for _, m in self.messages})
                pytest.fail(f"no {message} within {timeout:.0f} s; got {got}")
            self.poll(0.2)

    def pings_since(self, since: float) -> int:
        return sum(1 for when, m in self.messages if m == "WATCHDOG=1" and when > since)


@pytest.fixture
def notify_socket() -> Iterator[NotifySocket]:
    directory = Path(tempfile.mkdtemp(prefix="pfd-notify-", dir="/tmp"))  # short: 108-byte limit
    sock = NotifySocket(directory / "notify")
    try:
        yield sock
    finally:
        sock.sock.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_ready_watchdog_while_healthy_and_stopping(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    notify_socket: NotifySocket,
) -> None:
    upload("tfrecord", [64 * KIB] * 8, seed=1)
    # No trainer reads: once the RAM budget is full the daemon idles, running and healthy.
    config = write_config(tmp_path, epochs__count=1)
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "1000000"}
    daemon = run_daemon(config, env=env)

    ready = notify_socket.wait_for("READY=1", timeout=60)
    notify_socket.poll(3)
    assert notify_socket.pings_since(ready) >= 2, "no WATCHDOG=1 while every child is healthy"
    assert any(m.startswith("STATUS=running") for _, m in notify_socket.messages)

    # A hung child (SIGSTOP: alive, but no longer reporting) must starve the watchdog, so that
    # systemd restarts a daemon that stays unhealthy; once it reports again, pings resume.
    from prefetchd.config import load_config
    from prefetchd.layout import Layout
    from prefetchd.supervise.status import read_status

    status = read_status(Layout.of(load_config(config)))
    assert status is not None
    writer = status.children["writer-0"].pid
    assert writer is not None
    os.kill(writer, signal.SIGSTOP)
    try:
        quiet_since = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            mark = time.monotonic()
            notify_socket.poll(3)
            if notify_socket.pings_since(mark) == 0:
                quiet_since = mark
                break
        assert quiet_since is not None, "the watchdog was fed while a child was hung"
    finally:
        os.kill(writer, signal.SIGCONT)
    resumed = time.monotonic()
    deadline = resumed + 20
    while notify_socket.pings_since(resumed) == 0 and time.monotonic() < deadline:
        notify_socket.poll(0.5)
    assert notify_socket.pings_since(resumed) > 0, "the watchdog did not resume"

    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(60) == 0, daemon.output()
    notify_socket.poll(0.5)
    stopping = notify_socket.wait_for("STOPPING=1", timeout=1)
    assert stopping > ready
