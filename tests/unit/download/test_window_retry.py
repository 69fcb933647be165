"""Regression (the soak's stall): an object fetched again must not lose its room in
``download.window`` to the objects after it.

The downloader goes on to the next epoch's objects while an earlier one waits to be fetched
again (its copy failed verification, or a fault paused downloads). When the retry gave up its
room, the next epoch's objects took it; writers hold those until the earlier epoch ends, so the
window never emptied, the retry waited for ever, and the trainer with it ("no new shard of
epoch 0 for 120 s"). The downloader's real loop is driven here with a transfer that fetches at
once, and with no writer taking anything out of the window: the decisions are counted (turns of
the loop), never timed.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

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


class FlakyTransfer:
    """Fetches each object at once, in the caller's thread; the first ``corrupt[(epoch, seq)]``
    copies of an object arrive corrupt (as the soak's flipped bytes: MD5 does not match; made
    ``repeated``, the same wrong MD5 each time, as from a store holding bad bytes). Counts the
    fetches of each object in ``fetches``."""

    def __init__(
        self, done: Done, corrupt: dict[tuple[int, int], int], *, repeated: bool = False
    ) -> None:
        self.done = done
        self.corrupt = dict(corrupt)
        self.repeated = repeated
        self.fetches: Counter[tuple[int, int]] = Counter()

    def prepare(self, job: Job) -> None:
        job.error = None

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

    def poll(self, timeout: float) -> bool:
        return False

    def shutdown(self) -> None:
        pass

    def refresh_credentials(self) -> None:
        pass  # no store, no credentials to rotate


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


@pytest.fixture
def config(tmp_path: Path) -> Config:
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


def test_an_object_fetched_again_keeps_its_room_so_the_next_epoch_cannot_take_it(
    config: Config,
) -> None:
    layout, ready = run_downloader(config, {(0, 1): 1}, until=epoch_0_downloaded)
    assert layout.downloaded_marker(0).exists(), (
        f"epoch 0 never finished downloading: ready/ holds {ready}; the next epoch took the "
        "room of epoch 0's second object while it waited to be fetched again"
    )
    assert epochs_of(ready) == [0, 0], ready
    sizes = sum(os.path.getsize(layout.cache_ready / name) for name in ready)
    assert sizes <= WINDOW, f"{sizes} raw bytes on disk, over download.window"


def test_an_object_given_up_gives_its_room_to_the_next(config: Config) -> None:
    """Corrupt on every fetch: skipped (counted) after its last try, and its room goes to the
    next epoch's first object instead of being held for a retry that will never come."""

    def next_epoch_arrived(layout: Layout) -> bool:
        return 1 in epochs_of(os.listdir(layout.cache_ready))

    layout, ready = run_downloader(config, {(0, 1): 99}, until=next_epoch_arrived)
    assert layout.downloaded_marker(0).exists(), "a skipped object ends its epoch's download"
    assert epochs_of(ready) == [0, 1], ready


def test_an_object_corrupt_a_different_way_five_times_is_still_delivered(config: Config) -> None:
    """Bits flipped on the way, differently each time (the soak's proxy: ~9 % of the fetches of
    a five-part object): three corrupt fetches in a row are no reason to give up, so the sixth
    fetch, clean, is published."""
    used: list[FlakyTransfer] = []
    _, ready = run_downloader(config, {(0, 1): 5}, until=epoch_0_downloaded, transfer=used)
    assert epochs_of(ready) == [0, 0], ready
    assert used[0].fetches[(0, 1)] == 6


def test_an_object_corrupt_a_different_way_every_time_is_skipped_after_six(
    config: Config,
) -> None:
    used: list[FlakyTransfer] = []
    layout, ready = run_downloader(config, {(0, 1): 99}, until=epoch_0_downloaded, transfer=used)
    assert layout.downloaded_marker(0).exists(), "a skipped object ends its epoch's download"
    assert epochs_of(ready) == [0], ready
    assert used[0].fetches[(0, 1)] == 6


def test_the_same_wrong_bytes_again_are_skipped_after_three(config: Config) -> None:
    """The same wrong digest twice: the store holds those bytes, fetching more cannot help."""
    used: list[FlakyTransfer] = []
    layout, ready = run_downloader(
        config, {(0, 1): 99}, until=epoch_0_downloaded, transfer=used, repeated=True
    )
    assert layout.downloaded_marker(0).exists(), "a skipped object ends its epoch's download"
    assert epochs_of(ready) == [0], ready
    assert used[0].fetches[(0, 1)] == 3
