"""Whether the daemon behind a trainer's stream is alive: ``DaemonHealth``, and the wait for
its directories at start-up (``wait_for_dirs``)."""

from __future__ import annotations

import time
from collections.abc import Callable

from prefetchd.consume.access import check_trainer_access
from prefetchd.errors import DaemonFailed
from prefetchd.layout import Layout
from prefetchd.messages.status_record import DaemonState, StatusRecord


class DaemonHealth:
    """Raises once the daemon failed or has shown no sign of life for ``grace`` seconds.

    Owns the trainer's view of the daemon's status record. A sign of life is a status record
    newer than the last one seen; silence is measured on this process's monotonic clock, so a
    step of the wall clock (NTP) neither expires the grace nor stretches it. ``monotonic`` is
    injectable for tests."""

    def __init__(
        self, layout: Layout, grace: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.layout = layout
        self.grace = grace
        self.monotonic = monotonic
        self.started = monotonic()
        self.alive_at = self.started  # when a new status record was last seen
        self.last_seen: tuple[float, float] | None = None

    def _status(self) -> StatusRecord | None:
        try:
            return StatusRecord.decode(self.layout.status_file.read_bytes())
        except (OSError, ValueError):
            return None

    def check_failed(self) -> None:
        """Raise if the daemon reports ``failed`` (e.g. it found published shards lost)."""
        status = self._status()
        if status is not None and status.state == DaemonState.FAILED:
            raise DaemonFailed(f"prefetchd failed: {status.reason or 'see its log'}")

    def check(self) -> None:
        status = self._status()
        now = self.monotonic()
        if status is None:
            if now - self.started > self.grace:
                raise DaemonFailed(
                    f"prefetchd is not running for {self.layout.state} "
                    f"(no status after {self.grace:g} s)"
                )
            return
        if status.state == DaemonState.FAILED:
            raise DaemonFailed(f"prefetchd failed: {status.reason or 'see its log'}")
        updated = status.updated
        if (updated, status.updated_monotonic) != self.last_seen:
            self.last_seen = (updated, status.updated_monotonic)
            if self.last_seen != (0.0, 0.0) and status.age() < self.grace:
                self.alive_at = now
        if now - self.alive_at > self.grace:
            if status.state == DaemonState.DONE:
                raise DaemonFailed(
                    f"prefetchd finished its job at {time.ctime(updated)} and no daemon runs for "
                    f"{self.layout.state} since: start `prefetchd run` for this config first"
                )
            raise DaemonFailed(
                f"prefetchd has been gone for more than {self.grace:g} s "
                f"(last status update {time.ctime(updated)})"
            )


def wait_for_dirs(layout: Layout, health: DaemonHealth, poll: float) -> None:
    """Return once the daemon has made the RAM disk's hand-off directories, polling every
    ``poll`` seconds; raises as ``health.check()`` does, or if they are another user's."""
    check_trainer_access(layout)  # a daemon of another user: one line, not a PermissionError
    while not all(d.is_dir() for d in (layout.ram_ready, layout.ram_claimed, layout.ram_consumers)):
        health.check()
        time.sleep(poll)
        check_trainer_access(layout)
