"""The children's lifecycle, kept as Supervisor's ``process.py`` keeps it: spawn, notice ready,
reap, back off, restart, give up, stop. Every state change goes through ``states.CHILD``.

Every system call goes through one seam, as supervisord's tests swap ``Options`` for
``DummyOptions``: processes come from a ``Spawn`` function and time from a ``Clock``, so unit
tests drive crash -> backoff -> restart -> fatal with fake processes in milliseconds.

Restart policy: a child that exits while the daemon runs (or is killed for a lost heartbeat)
waits ``BACKOFF_START`` seconds, doubled for each quick crash in a row (one within
``QUICK_CRASH`` seconds of its start), at most ``BACKOFF_MAX``, and is spawned again. The
``MAX_QUICK_CRASHES``-th quick crash in a row gives up (fatal), and so does a child that exits
with ``CHILD_BOOT_FAILURE`` before it was ready: either fails the daemon.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prefetchd.messages.child_report import ChildReport
from prefetchd.roles.shell import CHILD_BOOT_FAILURE
from prefetchd.roles.table import Role
from prefetchd.supervise.states import CHILD, ChildState

log = logging.getLogger(__name__)

HEARTBEAT_TIMEOUT = 30.0  # a running child silent this long is hung: killed, then restarted
BACKOFF_START = 0.5
BACKOFF_MAX = 30.0
MAX_QUICK_CRASHES = 5  # crashes in a row, each within QUICK_CRASH seconds of its start
QUICK_CRASH = 30.0


class ChildProcess(Protocol):
    """What the lifecycle needs of a child process; ``multiprocessing.Process`` has it all."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> None: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


@dataclass
class Child:
    role: Role
    index: int
    state: ChildState = ChildState.STARTING
    process: ChildProcess | None = None
    restarts: int = 0
    quick_crashes: int = 0
    started_at: float = 0.0
    next_start: float = 0.0
    last_report: ChildReport | None = None  # this process's latest report; None: none yet

    @property
    def name(self) -> str:
        return self.role.child_name(self.index)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.is_alive()


Spawn = Callable[[Child], ChildProcess]  # starts a process running the child's role


@dataclass(frozen=True)
class Clock:
    """The lifecycle's one time source: uptimes, backoff delays, grace periods and heartbeats
    (children stamp ``ChildReport.beat`` with the system-wide CLOCK_MONOTONIC), never the
    wall clock, which NTP may step."""

    monotonic: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class Exit:
    """A child the lifecycle found dead; ``failure`` is set when it fails the daemon."""

    child: Child
    description: str
    failure: str | None = None


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: ``exited with code 1`` or ``killed by SIGKILL``
    (``multiprocessing`` and ``subprocess`` give a fatal signal as a negative exit code)."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal_name(-code)}"
    return f"exited with code {code}"


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def backoff_delay(quick_crashes: int) -> float:
    """Seconds to wait before restarting a child after its ``quick_crashes``-th quick crash."""
    return min(BACKOFF_MAX, BACKOFF_START * 2.0 ** (quick_crashes - 1))


class Lifecycle:
    """The children of one supervisor, moved through ``states.CHILD`` by its loop's calls."""

    def __init__(self, children: list[Child], spawn: Spawn, clock: Clock | None = None) -> None:
        self.children = children
        self._spawn = spawn
        self.clock = clock or Clock()

    def start_all(self) -> None:
        for child in self.children:
            self._start(child)

    def mark_ready(self) -> None:
        """A starting child whose report says it is ready is running."""
        for child in self.children:
            if (
                child.state is ChildState.STARTING
                and child.last_report is not None
                and child.last_report.ready
            ):
                CHILD.move(child, ChildState.RUNNING, child.name, f"pid {child.pid}")

    def all_running(self) -> bool:
        return all(c.state is ChildState.RUNNING for c in self.children)

    def reap(self) -> list[Exit]:
        """Move each child that died since the last call to backoff or fatal, and return how
        each ended."""
        now = self.clock.monotonic()
        dead = [
            c
            for c in self.children
            if c.state in (ChildState.STARTING, ChildState.RUNNING)
            and c.process is not None
            and not c.process.is_alive()
        ]
        return [self._on_exit(child, now) for child in dead]

    def restart_due(self) -> None:
        """Spawn again each child in backoff whose delay has elapsed."""
        now = self.clock.monotonic()
        for child in self.children:
            if child.state is ChildState.BACKOFF and now >= child.next_start:
                child.restarts += 1
                self._start(child)

    def kill_hung(self) -> None:
        """SIGKILL each running child that stopped reporting (SIGSTOP, a stuck system call);
        ``reap`` then restarts it like any crash."""
        now = self.clock.monotonic()  # children stamp ``beat`` with the same system-wide clock
        for child in self.children:
            beat = child.last_report.beat if child.last_report is not None else 0.0
            silent = now - beat
            if child.state is not ChildState.RUNNING or not beat or silent <= HEARTBEAT_TIMEOUT:
                continue
            if child.process is not None and child.process.is_alive():
                log.error(
                    "%s (pid %s) stopped reporting for %.0fs; killing it",
                    child.name,
                    child.pid,
                    silent,
                )
                child.process.kill()

    def stop(self, grace: float) -> None:
        """SIGTERM every child still alive, give them ``grace`` seconds in all, SIGKILL the
        rest. No child is restarted afterwards: all but the fatal ones end ``exited``."""
        stopping = [c for c in self.children if CHILD.allows(c.state, ChildState.STOPPING)]
        for child in stopping:
            CHILD.move(child, ChildState.STOPPING, child.name)
            if child.process is not None and child.process.is_alive():
                child.process.terminate()
        deadline = self.clock.monotonic() + grace
        for child in stopping:
            ended = self._wait_or_kill(child, deadline, grace)
            CHILD.move(child, ChildState.EXITED, child.name, ended)

    # --- one child ----------------------------------------------------------------------------

    def _start(self, child: Child) -> None:
        child.process = self._spawn(child)
        child.started_at = self.clock.monotonic()
        child.last_report = None
        if child.state is ChildState.BACKOFF:
            CHILD.move(
                child, ChildState.STARTING, child.name, f"restart {child.restarts}, pid {child.pid}"
            )
        log.debug("started %s (pid %s)", child.name, child.pid)

    def _on_exit(self, child: Child, now: float) -> Exit:
        assert child.process is not None
        code = child.process.exitcode
        child.process.join(0)
        ended = describe_exit(code)
        report = child.last_report
        reason = (report.boot_error or report.fatal) if report is not None else None
        said = f" ({reason})" if reason else ""
        if child.state is ChildState.STARTING and code == CHILD_BOOT_FAILURE:
            CHILD.move(child, ChildState.FATAL, child.name, f"pid {child.pid} {ended}{said}")
            return Exit(child, ended, f"{child.name} could not start: {reason or ended}")
        uptime = now - child.started_at
        child.quick_crashes = child.quick_crashes + 1 if uptime < QUICK_CRASH else 1
        give_up = child.quick_crashes >= MAX_QUICK_CRASHES
        delay = backoff_delay(child.quick_crashes)
        plan = "giving up" if give_up else f"restarting in {delay:.1f}s"
        CHILD.move(child, ChildState.BACKOFF, child.name, f"pid {child.pid} {ended}{said}; {plan}")
        if give_up:
            return self._give_up(child, ended, reason)
        child.next_start = now + delay
        return Exit(child, ended)

    def _give_up(self, child: Child, ended: str, reason: str | None) -> Exit:
        crashes = child.quick_crashes
        CHILD.move(
            child,
            ChildState.FATAL,
            child.name,
            f"{crashes} crashes in a row, each within {QUICK_CRASH:.0f}s of its start",
        )
        failure = f"{child.name} crashed {crashes} times in a row" + (
            f"; last error: {reason}" if reason else f" ({ended})"
        )
        return Exit(child, ended, failure)

    def _wait_or_kill(self, child: Child, deadline: float, grace: float) -> str:
        """Wait for a stopping child until ``deadline``, SIGKILL it after; how it ended."""
        process = child.process
        if process is None:
            return "never started"
        process.join(max(0.0, deadline - self.clock.monotonic()))
        if process.is_alive():
            log.warning("%s did not stop in %.0fs; killing it", child.name, grace)
            process.kill()
            process.join(5)
        return describe_exit(process.exitcode)
