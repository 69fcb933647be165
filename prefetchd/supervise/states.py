"""States of the daemon and its children, with their transitions (a leaf module).

Daemon (``status.json`` ``state``)::

    starting --children booted--> running --last epoch consumed--> done
    starting --a child failed to boot--> failed
    running  --a child keeps crashing--> failed
    starting|running --SIGTERM/SIGINT--> draining --children stopped--> (exit 0)

Child (per process, in the supervisor)::

    STARTING --reported ready--> RUNNING --exit 0--> EXITED
    STARTING --exit before ready--> FATAL            (boot failure stops the daemon)
    RUNNING  --crash / lost heartbeat--> BACKOFF --delay elapsed--> STARTING
    BACKOFF  --too many crashes in a row--> FATAL
    any      --daemon draining--> STOPPING --exit--> EXITED
"""

from __future__ import annotations

import enum


class DaemonState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    DONE = "done"
    FAILED = "failed"


class ChildState(enum.StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    BACKOFF = "backoff"
    STOPPING = "stopping"
    EXITED = "exited"
    FATAL = "fatal"


# Exit code a child uses when it cannot boot (bad bucket, credentials): the supervisor stops
# the daemon with the child's reason instead of restarting it (gunicorn's WORKER_BOOT_ERROR).
CHILD_BOOT_FAILURE = 3
