"""An epoch's end reaches the trainers without waiting for the next full check: the supervisor
marks an epoch complete on the tick its last object is released (not up to
``EPOCH_CHECK_INTERVAL`` later), and a trainer waiting in ``ready_files()`` is woken by the
marker itself. Both are decisions and wake-ups, counted, never timed."""

from __future__ import annotations

import time

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.consume.ready import _watch_epoch_ends
from prefetchd.inotify import IN_MOVED_TO, Watch
from prefetchd.layout import Layout, object_name, writer_claim_name
from prefetchd.supervise.supervisor import Supervisor


def supervisor_between_full_checks(config: Config) -> Supervisor:
    """A supervisor whose last full epoch check (with the disks') was just now."""
    sup = Supervisor(config)
    sup.epochs._last_epoch_check = time.monotonic()
    return sup


def test_an_epoch_is_marked_complete_on_the_tick_its_last_object_is_released(
    config: Config, layout: Layout
) -> None:
    """Regression: the marker waited for the once-a-second check, and trainers (and a job of
    one epoch) with it."""
    sup = supervisor_between_full_checks(config)
    held = layout.cache_claimed / writer_claim_name(0, object_name(0, 7, "ab" * 12))
    held.write_bytes(b"x")
    layout.downloaded_marker(0).write_text("")
    sup.epochs.check()
    assert not layout.complete_marker(0).exists(), "a writer still holds an object of epoch 0"
    held.unlink()  # its last record is in a published shard
    sup.epochs.check()
    assert layout.complete_marker(0).exists()
    assert sup.epochs.next_epoch == 1


def test_no_marker_before_the_epoch_is_downloaded(config: Config, layout: Layout) -> None:
    sup = supervisor_between_full_checks(config)
    sup.epochs.check()
    assert not layout.complete_marker(0).exists()
    assert sup.epochs.next_epoch == 0


def test_a_waiting_trainer_is_woken_by_the_epoch_marker(layout: Layout) -> None:
    with Watch(layout.ram_ready, IN_MOVED_TO) as arrivals:
        _watch_epoch_ends(arrivals, layout)
        assert not arrivals.wait(0)
        write_atomic(layout.complete_marker(0), b"{}")
        assert arrivals.wait(10.0), "the rename of the marker wakes the wait"


def test_a_state_dir_that_cannot_be_watched_leaves_the_poll(layout: Layout) -> None:
    """Not there (or not readable): no error, the trainer's poll still finds the marker."""
    layout.epochs.rmdir()
    with Watch(layout.ram_ready, IN_MOVED_TO) as arrivals:
        _watch_epoch_ends(arrivals, layout)
        assert not arrivals.wait(0)
