"""States of the daemon and its children, and the one way to change them.

``DaemonState`` is the status record's (``messages/status_record.py``: trainers read it too);
the daemon's transitions are here.

Each state machine is a table of the transitions it allows, each labelled with the event that
causes it and logged at the level that event deserves. ``Machine.move`` checks a change against
the table, logs it and assigns it: it is the only place a state is assigned. A change the table
does not allow is a bug in the supervisor, and raises ``IllegalTransition``. The diagrams below
are rendered from the tables (``Machine.diagram``); a unit test keeps them equal.

Daemon (``status.json`` ``state``; ``done`` and ``failed`` are final, and ``draining`` ends
with the process, exit 0)::

    starting --every child reported ready--> running
    starting --a child could not start or kept crashing, or shards were lost--> failed
    starting --SIGTERM, SIGINT or SIGHUP--> draining
    starting --last epoch consumed (resumed job)--> done
    running  --a child could not start or kept crashing, or shards were lost--> failed
    running  --SIGTERM, SIGINT or SIGHUP--> draining
    running  --last epoch consumed--> done

Child (per process, in the supervisor; ``fatal`` and ``exited`` are final)::

    starting --reported ready--> running
    starting --exited with the boot-failure code before ready--> fatal
    starting --exited before ready--> backoff
    starting --daemon stopping--> stopping
    running  --exited unasked or killed for a lost heartbeat--> backoff
    running  --daemon stopping--> stopping
    backoff  --delay elapsed: respawned--> starting
    backoff  --too many quick crashes in a row--> fatal
    backoff  --daemon stopping--> stopping
    stopping --exited or killed after the grace period--> exited
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from prefetchd.messages.status_record import DaemonState

log = logging.getLogger(__name__)


class ChildState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    EXITED = "exited"
    FATAL = "fatal"


S = TypeVar("S", bound=enum.StrEnum)


class IllegalTransition(RuntimeError):
    """A state change the machine's table does not allow: a programming error."""


class Stateful(Protocol[S]):
    """Anything that holds a state of one machine (a child, the supervisor)."""

    state: S


@dataclass(frozen=True)
class Transition(Generic[S]):
    source: S
    target: S
    label: str  # the event that causes it, as the diagram and the log show it
    level: int  # logging level: a crash is an error, a child getting ready is news


class Machine(Generic[S]):
    """A table of allowed transitions and the function that performs them."""

    def __init__(self, transitions: Iterable[Transition[S]]) -> None:
        self.transitions = tuple(transitions)
        self._table = {(t.source, t.target): t for t in self.transitions}
        if len(self._table) != len(self.transitions):
            raise ValueError("a transition is listed twice")

    def allows(self, source: S, target: S) -> bool:
        return (source, target) in self._table

    def move(self, subject: Stateful[S], target: S, who: str, detail: str = "") -> None:
        """Move ``subject`` (called ``who`` in the log) to ``target`` and log why, at the level
        the table gives. Raises ``IllegalTransition`` if the table has no such transition."""
        source = subject.state
        step = self._table.get((source, target))
        if step is None:
            raise IllegalTransition(f"{who}: {source} -> {target} is not a transition")
        log.log(step.level, "%s: %s -> %s (%s)%s", who, source, target, step.label, _suffix(detail))
        subject.state = target

    def diagram(self) -> str:
        """The table as the module docstring draws it: ``source --label--> target`` lines."""
        width = max(len(t.source) for t in self.transitions)
        return "\n".join(
            f"    {t.source:<{width}} --{t.label}--> {t.target}" for t in self.transitions
        )


def _suffix(detail: str) -> str:
    return f": {detail}" if detail else ""


_STOP_SIGNALS = "SIGTERM, SIGINT or SIGHUP"
_CHILD_STOPPING = "daemon stopping"
_CHILD_FATAL = "a child could not start or kept crashing, or shards were lost"
D = DaemonState
C = ChildState

DAEMON = Machine(
    [
        Transition(D.STARTING, D.RUNNING, "every child reported ready", logging.INFO),
        Transition(D.STARTING, D.FAILED, _CHILD_FATAL, logging.ERROR),
        Transition(D.STARTING, D.DRAINING, _STOP_SIGNALS, logging.INFO),
        Transition(D.STARTING, D.DONE, "last epoch consumed (resumed job)", logging.INFO),
        Transition(D.RUNNING, D.FAILED, _CHILD_FATAL, logging.ERROR),
        Transition(D.RUNNING, D.DRAINING, _STOP_SIGNALS, logging.INFO),
        Transition(D.RUNNING, D.DONE, "last epoch consumed", logging.INFO),
    ]
)

CHILD = Machine(
    [
        Transition(C.STARTING, C.RUNNING, "reported ready", logging.INFO),
        Transition(
            C.STARTING, C.FATAL, "exited with the boot-failure code before ready", logging.ERROR
        ),
        Transition(C.STARTING, C.BACKOFF, "exited before ready", logging.ERROR),
        Transition(C.STARTING, C.STOPPING, _CHILD_STOPPING, logging.DEBUG),
        Transition(
            C.RUNNING, C.BACKOFF, "exited unasked or killed for a lost heartbeat", logging.ERROR
        ),
        Transition(C.RUNNING, C.STOPPING, _CHILD_STOPPING, logging.DEBUG),
        Transition(C.BACKOFF, C.STARTING, "delay elapsed: respawned", logging.INFO),
        Transition(C.BACKOFF, C.FATAL, "too many quick crashes in a row", logging.ERROR),
        Transition(C.BACKOFF, C.STOPPING, _CHILD_STOPPING, logging.DEBUG),
        Transition(C.STOPPING, C.EXITED, "exited or killed after the grace period", logging.INFO),
    ]
)
