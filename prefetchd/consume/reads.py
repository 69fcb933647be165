"""Which of this process's claims it has read: ``ClaimReads``, the pure state machine behind
the ``ShardReleaser`` (which feeds it inotify events and ``/proc/self/fd`` scans, and retires
what it returns). No I/O here, so every transition is testable without files or threads."""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable


class ReadState(enum.Enum):
    """One tracked claim's state. Transitions (``ClaimReads``):

    - UNREAD -> READING, DOUBTFUL -> READING: a scan finds the claim among the open files;
    - READING -> read: an event of the claim, or a resync, finds it no longer open;
    - UNREAD -> DOUBTFUL: closed before any scan saw it open (a read faster than the scan, or
      another process's open and close);
    - DOUBTFUL -> read: a later claim is being read, or the process wants more (it waits, its
      epoch is over, it exits) and does not hold it.
    """

    UNREAD = "unread"
    READING = "reading"
    DOUBTFUL = "doubtful"


class ClaimReads:
    """Owns each tracked claim's ``ReadState``, the order claims were made in, and which
    claims are retained (a resumable stream's: read, but kept until a saved position covers
    them). The methods that find claims read forget them and return those to retire, in
    order; a retained claim found read is forgotten but not returned. Not thread-safe: the
    ``ShardReleaser`` calls it under its lock."""

    def __init__(self) -> None:
        self._states: dict[str, ReadState] = {}
        self._order: dict[str, int] = {}  # claimed name -> how many claims came before it
        self._claims = itertools.count()
        self._retained: set[str] = set()  # claims of resumable streams: never retired here

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, name: object) -> bool:
        return name in self._states

    def track(self, name: str, *, retain: bool) -> None:
        """A new claim: UNREAD, the newest; ``retain``: keep it once read."""
        self._states[name] = ReadState.UNREAD
        self._order[name] = next(self._claims)
        if retain:
            self._retained.add(name)

    def retain(self, name: str) -> None:
        """Keep the tracked claim ``name`` once read (its stream became resumable)."""
        if name in self._states:
            self._retained.add(name)

    def untrack(self, name: str) -> None:
        """Forget ``name`` (its stream retired it or gave it back)."""
        self._states.pop(name, None)
        self._order.pop(name, None)
        self._retained.discard(name)

    def clear(self) -> None:
        """Forget every claim (a forked child's inherited copy: the claims are its parent's)."""
        self._states.clear()
        self._order.clear()
        self._retained.clear()

    def has_doubtful(self) -> bool:
        return ReadState.DOUBTFUL in self._states.values()

    def finished(self, name: str) -> list[str]:
        """The process's own code is done with ``name``: read, whatever its state."""
        return self._read(name) if name in self._states else []

    def seen(self, touched: Iterable[str], closed: set[str], held: set[str]) -> list[str]:
        """A batch of events opened or closed the claims ``touched`` (``closed``: those it
        closed); ``held``: the claims the process holds open now."""
        done = []
        for name in touched:
            if name in held:
                self._states[name] = ReadState.READING
            elif self._states[name] == ReadState.READING:
                done += self._read(name)  # held and held no more: read
            elif name in closed:
                self._states[name] = ReadState.DOUBTFUL
        return done + self._settle_doubtful(held)

    def resync(self, held: set[str]) -> list[str]:
        """Events were lost: trust ``held`` for every claim. One opened and closed entirely
        within the lost events stays UNREAD (kept; the daemon gives it back after exit)."""
        done = []
        for name, state in list(self._states.items()):
            if name in held:
                self._states[name] = ReadState.READING
            elif state == ReadState.READING:
                done += self._read(name)
        return done + self._settle_doubtful(held)

    def doubtful_not_held(self, held: set[str]) -> list[str]:
        """The process wants more (or exits): its doubtful claims not in ``held`` were read."""
        done = []
        for name, state in list(self._states.items()):
            if state == ReadState.DOUBTFUL and name not in held:
                done += self._read(name)
        return done

    def _settle_doubtful(self, held: set[str]) -> list[str]:
        """The doubtful claims older than the newest claim the process reads now were read
        (trainers open their shards in the order they got them)."""
        newest = max((self._order.get(n, -1) for n in held), default=-1)
        done = []
        for name, state in list(self._states.items()):
            if state == ReadState.DOUBTFUL and self._order.get(name, newest) < newest:
                done += self._read(name)
        return done

    def _read(self, name: str) -> list[str]:
        del self._states[name]
        self._order.pop(name, None)
        return [] if name in self._retained else [name]  # retained: kept until covered
