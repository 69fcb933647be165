"""Regression (the soak's stall): a writer takes no object of a later epoch while an earlier
epoch can still bring objects (it is not yet downloaded).

Trainers read epochs in order. Writers that took the next epoch's objects early (a writer just
restarted took whatever came first; others after 0.5 s without input) filled the RAM budget
with shards no trainer could read yet and then waited inside the budget, holding those objects.
The earlier epoch's last object, fetched again after a fault, arrived after that: no writer
took it, the epoch never ended, nothing freed the budget, and the trainer gave up ("no new shard
of epoch 0 for 120 s"). Driven step by step on a fake clock: decisions, never timings.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.inotify import IN_MOVED_TO, Watch
from prefetchd.layout import Layout
from prefetchd.write.flush import IDLE_FLUSH
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import FakeClock, lines_config, publish


@pytest.fixture
def config(tmp_path: Path) -> Config:
    output = {"ram_budget": "64MiB", "shard_size": "1MiB", "writers": 2, "mix": 4}
    return lines_config(tmp_path, epochs={"count": 2, "seed": 1}, output=output)


def arrive(config: Config, epoch: int, seq: int) -> str:
    """The downloader publishes object ``seq`` of ``epoch`` (a few JSON lines) into ready/."""
    body = b"".join(b'{"e": %d, "o": %d, "i": %d}\n' % (epoch, seq, i) for i in range(50))
    return publish(config, epoch, seq, body)


def downloaded(config: Config, epoch: int) -> None:
    Layout.of(config).downloaded_marker(epoch).write_text("{}")


@pytest.fixture
def writer(config: Config) -> Iterator[Writer]:
    """Writer 0 after its start-up, watching ready/ for arrivals as its ``run()`` does."""
    writer = Writer(ChildContext("writer-0", config), 0)
    writer._recover()
    with Watch(Layout.of(config).cache_ready, IN_MOVED_TO) as arrivals:
        writer.arrivals.watch = arrivals
        yield writer


def turn(writer: Writer) -> None:
    """One turn of the writer's loop with nothing open: note arrivals, open what it may."""
    writer.arrivals.wait(0)
    writer._refill()


def open_epochs(writer: Writer) -> list[int]:
    return [obj.epoch for obj in writer.mixer.open]


def write_all(writer: Writer) -> None:
    """Turns of the writer's loop until its open objects are drained, then publish."""
    for _ in range(100):
        if not writer.mixer.open:
            writer.publisher.publish()
            return
        writer._step()
    raise AssertionError("100 steps did not drain a few small objects")


def test_a_restarted_writer_waits_for_the_earlier_epoch_instead_of_taking_the_next(
    config: Config, writer: Writer, clock: FakeClock
) -> None:
    later = arrive(config, 1, 0)
    turn(writer)
    assert writer.mixer.open == [], "epoch 0 is not downloaded: its objects may still arrive"
    assert (Layout.of(config).cache_ready / later).exists()
    clock.now += 10 * IDLE_FLUSH
    turn(writer)
    assert writer.mixer.open == [], "waiting longer changes nothing"
    arrive(config, 0, 2)  # epoch 0's last object, fetched again after a fault (writer 0's turn)
    turn(writer)
    assert open_epochs(writer) == [0], "the late object of epoch 0 is taken at once"


def test_a_writer_moves_on_only_once_the_epoch_is_downloaded(
    config: Config, writer: Writer, clock: FakeClock
) -> None:
    arrive(config, 0, 0)
    arrive(config, 1, 0)
    turn(writer)
    assert open_epochs(writer) == [0]
    write_all(writer)
    clock.now += 10 * IDLE_FLUSH  # input dried up: it used to move on to epoch 1 here
    turn(writer)
    assert writer.mixer.open == [], "epoch 0 can still bring an object: no shard of epoch 1 yet"
    downloaded(config, 0)
    turn(writer)
    assert open_epochs(writer) == [1], "epoch 0 downloaded: its objects are all in hand"


def test_an_earlier_object_listed_after_the_marker_goes_first(
    config: Config, writer: Writer, clock: FakeClock
) -> None:
    """The listing a writer chose from may predate the earlier epoch's last object and its
    ``downloaded`` marker (the arrival not yet read from inotify): it looks again before it
    moves on, and takes the earlier object."""
    arrive(config, 1, 0)
    turn(writer)  # lists ready/: only epoch 1's object, and epoch 0 not downloaded
    assert writer.mixer.open == []
    arrive(config, 0, 2)  # writer 0's turn (seq % 2 == 0), as epoch 1's object is
    downloaded(config, 0)
    writer._refill()  # chooses from the old listing: epoch 1's object
    assert writer.mixer.open == [], "it looked again and found epoch 0's object first"
    writer._refill()
    assert open_epochs(writer) == [0]
