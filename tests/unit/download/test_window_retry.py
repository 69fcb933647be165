"""Regression (the soak's stall): an object fetched again must not lose its room in
``download.window`` to the objects after it.

The downloader goes on to the next epoch's objects while an earlier one waits to be fetched
again (its copy failed verification, or a fault paused downloads). When the retry gave up its
room, the next epoch's objects took it; writers hold those until the earlier epoch ends, so the
window never emptied, the retry waited for ever, and the trainer with it ("no new shard of
epoch 0 for 120 s"). The downloader's real loop is driven here with a transfer that fetches at
once, and with no writer taking anything out of the window (``loop_harness.py``): the decisions
are counted (turns of the loop), never timed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefetchd.config import Config
from prefetchd.layout import Layout
from tests.unit.download.loop_harness import (
    WINDOW,
    FlakyTransfer,
    epoch_0_downloaded,
    epochs_of,
    run_downloader,
    two_epochs,
)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return two_epochs(tmp_path)


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
