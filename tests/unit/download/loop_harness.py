"""The downloader's real loop (``Downloader._loop``) driven with no store: a transfer that
fetches each object at once in the caller's thread, two objects of ``SIZE`` an epoch, no writer
taking anything out of the window, and a bounded number of turns. Shared by the tests of the
window's retries and of a full disk at publishing; ``NoStoreTransfer`` is the protocol's tail
any such fake shares (nothing to poll, shut down or refresh).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from prefetchd.child.context import ChildContext
from prefetchd.config import Config, config_from_dict
from prefetchd.download.downloader import Downloader
from prefetchd.download.jobs import Done, Job
from prefetchd.download.order import SourceObject
from prefetchd.download.share import ShareTable
from prefetchd.download.verify import IntegrityError
from prefetchd.inotify import IN_DELETE, IN_MOVED_FROM, Watch
from prefetchd.layout import Layout, parse_object_name

KIB = 1024
WINDOW = 1024 * KIB
SIZE = 400 * KIB  # two fit in the window, a third does not
TURNS = 400  # loop turns before the test gives up (each waiting turn waits 0.05 s at most)


class NoStoreTransfer:
    """A transfer with no store: a subclass's ``submit_parts`` settles each job at once, in
    the caller's thread, through ``done``; there is nothing to poll, shut down or refresh."""

    def __init__(self, done: Done) -> None:
        self.done = done

    def prepare(self, job: Job) -> None:
        job.error = None

    def poll(self, timeout: float) -> bool:
        return False

    def shutdown(self) -> None:
        pass

    def refresh_credentials(self) -> None:
        pass  # no store, no credentials to rotate


class FlakyTransfer(NoStoreTransfer):
    """Fetches each object at once, in the caller's thread; the first ``corrupt[(epoch, seq)]``
    copies of an object arrive corrupt (as the soak's flipped bytes: MD5 does not match; made
    ``repeated``, the same wrong MD5 each time, as from a store holding bad bytes). Counts the
    fetches of each object in ``fetches``."""

    def __init__(
        self, done: Done, corrupt: dict[tuple[int, int], int], *, repeated: bool = False
    ) -> None:
        super().__init__(done)
        self.corrupt = dict(corrupt)
        self.repeated = repeated
        self.fetches: Counter[tuple[int, int]] = Counter()

    def submit_parts(self, job: Job, timeout: float) -> bool:
        job.tmp.write_bytes(b"x" * job.obj.size)
        self.fetches[(job.epoch, job.seq)] += 1
        if self.corrupt.get((job.epoch, job.seq), 0) > 0:
            self.corrupt[(job.epoch, job.seq)] -= 1
            first = self.fetches[(job.epoch, job.seq)] == 1
            job.error = IntegrityError(
                "MD5 0000 does not match the ETag 1111", repeated=self.repeated and not first
            )
        self.done(job)
        return True


class Turns(ChildContext):
    """A child context whose loop stops once ``finished()`` holds (seen on the next turn, as a
    stop signal's flag is) or after ``turns`` looks at ``should_stop`` (the loop asks it every
    ``STOP_CHECK_EVERY`` seconds at least, so the test is bounded in time)."""

    def __init__(self, config: Config, finished: Callable[[], bool], turns: int) -> None:
        self.finished = finished
        super().__init__("downloader", config)
        self.turns = turns

    @property
    def stopping(self) -> bool:
        return self._stopping or self.finished()

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self._stopping = value

    def should_stop(self) -> bool:
        self.turns -= 1
        return self.stopping or self.turns < 0


def two_epochs(tmp_path: Path) -> Config:
    """Two epochs in order, a window of two objects of ``SIZE`` (a third does not fit)."""
    return config_from_dict(
        {
            "source": {"url": "s3://bucket/d/"},
            "epochs": {"count": 2, "shuffle": False},
            "download": {"cache_dir": str(tmp_path / "cache"), "window": WINDOW},
            "output": {"ram_dir": str(tmp_path / "ram")},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )


def run_downloader(
    config: Config,
    corrupt: dict[tuple[int, int], int],
    until: Callable[[Layout], bool],
    transfer: list[FlakyTransfer] | None = None,
    *,
    repeated: bool = False,
    downloaders: list[Downloader] | None = None,
) -> tuple[Layout, list[str]]:
    """Run the downloader's loop over two objects of ``SIZE`` an epoch until ``until(layout)``
    (or ``TURNS`` turns), with no writer taking anything. Returns the names in ready/ (and
    appends the transfer used to ``transfer``, the downloader to ``downloaders``)."""
    layout = Layout.of(config)
    layout.create()
    downloader = Downloader(Turns(config, lambda: until(layout), TURNS))
    if downloaders is not None:
        downloaders.append(downloader)
    downloader.plan.share = ShareTable.of(SourceObject(f"d/{i}", SIZE, None) for i in range(2))
    flaky = FlakyTransfer(downloader._transfer_done, corrupt, repeated=repeated)
    if transfer is not None:
        transfer.append(flaky)
    downloader.transfer = flaky
    with (
        Watch(layout.cache_claimed, IN_DELETE | IN_MOVED_FROM) as deletions,
        Watch(layout.cache_ready, IN_DELETE) as vanished,
    ):
        downloader.admission.watch(deletions, vanished)
        downloader._loop()
    return layout, sorted(os.listdir(layout.cache_ready))


def epochs_of(names: list[str]) -> list[int]:
    return [parsed[0] for parsed in map(parse_object_name, names) if parsed is not None]


def epoch_0_downloaded(layout: Layout) -> bool:
    return layout.downloaded_marker(0).exists()
