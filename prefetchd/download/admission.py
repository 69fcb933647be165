"""The room objects are admitted into, and how it is given back.

Raw bytes on local disk (published, claimed or being fetched) stay within ``download.window``.
An object fetched again keeps its room until it is published or skipped: the next epoch's
objects, which writers leave alone until then, must not take it. Kept copies handed to the
writers take no disk of their own, so they are held to a second account (``handoff``, also
``download.window`` bytes) instead; it keeps ``ready/`` as short as downloads do. Room comes
back when a writer deletes (or renames away) its claimed object, which inotify reports.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from prefetchd.budget import Window
from prefetchd.download.jobs import Job
from prefetchd.download.retries import Retries
from prefetchd.inotify import Watch
from prefetchd.layout import Layout, claimed_object

# How often the busy loop reads the inotify watches (two reads, each mostly EAGAIN): a freed
# window is looked for at once when an object does not fit, so this only delays noticing.
DELETIONS_EVERY = 0.02


class Admission:
    """Owns the two byte accounts (``window`` for downloads, ``handoff`` for kept copies), what
    is charged to them after a start-up or a lost event (the objects on disk and in flight),
    and the inotify watches that free their room: deletions from ``claimed/`` (a writer is
    done) and from ``ready/`` (someone else deleted an object no writer read: ``vanished``)."""

    deletions: Watch  # claimed/: IN_DELETE | IN_MOVED_FROM
    vanished_watch: Watch  # ready/: IN_DELETE (writers rename out of ready/, never delete)

    def __init__(
        self,
        layout: Layout,
        window: Window,
        handoff: Window,
        active: dict[str, Job],
        retries: Retries,
        vanished: Callable[[str], None],
    ) -> None:
        self.layout = layout
        self.window = window
        self.handoff = handoff
        self.active = active
        self.retries = retries
        self.vanished = vanished  # called with the name of each object gone from ready/
        self.linked: set[str] = set()  # objects on disk whose bytes are also kept (start-up)
        self.deletions_due = 0.0  # monotonic time the busy loop next reads the watches

    def watch(self, deletions: Watch, vanished: Watch) -> None:
        self.deletions = deletions
        self.vanished_watch = vanished

    def apply_deletions(self, timeout: float) -> None:
        """Give back the room of what writers are done with; wait up to ``timeout`` for it."""
        self.deletions_due = time.monotonic() + DELETIONS_EVERY
        for event in self.vanished_watch.read_now():
            if not event.overflow:
                self.vanished(event.name)
        freed: list[str] = []  # released per batch of events: two calls per read, not object
        for event in self.deletions.read(timeout):
            if event.overflow:
                self.window.release_all(freed)  # before the reset, which recounts from disk
                self.handoff.release_all(freed)
                freed.clear()
                self.reset({**self.on_disk(), **self._in_flight_sizes()})
                continue
            name = claimed_object(event.name)
            if name is not None:
                freed.append(name)
        if freed:
            self.window.release_all(freed)
            self.handoff.release_all(freed)

    def on_disk(self) -> dict[str, int]:
        """The sizes of the objects in ``ready/`` and ``claimed/``, by local name; notes those
        whose bytes are also kept (hard links) for ``reset``."""
        held: dict[str, int] = {}
        for directory in (self.layout.cache_ready, self.layout.cache_claimed):
            for entry in os.scandir(directory):
                name = claimed_object(entry.name) if directory.name == "claimed" else entry.name
                if name is None:
                    continue
                try:
                    info = entry.stat()
                except FileNotFoundError:
                    continue
                held[name] = info.st_size
                if info.st_nlink > 1:
                    self.linked.add(name)
        return held

    def reset(self, held: dict[str, int]) -> None:
        """Charge what is on disk (after a start-up or a lost inotify event) to the window,
        except kept objects handed to the writers, which the hand-over account holds."""
        kept = {n: s for n, s in held.items() if n in self.linked}
        self.window.reset({n: s for n, s in held.items() if n not in kept})
        self.handoff.reset(kept)
        self.linked.clear()

    def _in_flight_sizes(self) -> dict[str, int]:
        """The room of the jobs being fetched and of the retries that keep theirs."""
        held = {
            job.name: job.obj.size for _, job in self.retries.queue if job.name in self.window.held
        }
        return {**held, **{name: job.obj.size for name, job in self.active.items()}}
