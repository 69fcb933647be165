"""A writer waiting to fill its mix lets arrivals gather for ``GATHER`` after the one that woke
it, so one wake takes several objects (behind a paced network they arrive spread out, and a
writer that keeps up woke for nearly each one); never while it starts, and never past a
decision the flush clock would make for a starved trainer. Driven on a fake clock whose
sleeps are when the next objects arrive: wakes and sleeps are counted, never timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.inotify import IN_MOVED_TO, Event, Watch
from prefetchd.layout import Layout, parse_object_name
from prefetchd.write.flush import FIRST_SHARDS, GATHER, STARVED_FILL, STARVED_FLUSH
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import FakeClock, StopWhenConsumed, lines_config, publish

MIX = 8


def config_for(root: Path) -> Config:
    output = {"ram_budget": "64MiB", "shard_size": "16MiB", "writers": 1, "mix": MIX}
    return lines_config(root, epochs={"count": 1, "seed": 1, "shuffle": True}, output=output)


def claim_all(writer: Writer) -> list[int]:
    seqs = []
    while (name := writer._claim_next()) is not None:
        parsed = parse_object_name(name)
        assert parsed is not None
        seqs.append(parsed[1])
    return seqs


def test_one_wake_takes_the_objects_that_arrive_while_it_gathers(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = config_for(tmp_path)
    writer = Writer(ChildContext("writer-0", config), 0)
    sleeps: list[float] = []
    arriving = iter(range(1, 4))

    def sleep(seconds: float) -> None:  # three more objects arrive while the writer gathers
        sleeps.append(seconds)
        for seq in arriving:
            publish(config, 0, seq, b'{"a": 1}\n')
        clock.now += seconds

    monkeypatch.setattr(clock, "sleep", sleep)
    with Watch(Layout.of(config).cache_ready, IN_MOVED_TO) as watch:
        writer.arrivals.watch = watch
        assert claim_all(writer) == []
        publish(config, 0, 0, b'{"a": 1}\n')
        writer.arrivals.wait(1.0, gather=GATHER, want=MIX)
        assert claim_all(writer) == [0, 1, 2, 3]
        assert sleeps == [GATHER]
        # a wake that already brought what the mix lacks claims at once
        publish(config, 0, 4, b'{"a": 1}\n')
        writer.arrivals.wait(1.0, gather=GATHER, want=1)
        assert claim_all(writer) == [4]
        assert sleeps == [GATHER]


def test_the_flush_clock_lets_arrivals_gather_only_when_no_decision_falls_due(
    tmp_path: Path, clock: FakeClock
) -> None:
    writer = Writer(ChildContext("writer-0", config_for(tmp_path)), 0)
    flush = writer.clock
    assert flush.starting() and flush.gather() == 0, "the first shards wait for nothing"
    flush.published = FIRST_SHARDS
    flush.shard_opened()
    assert flush.gather() == GATHER
    clock.now += STARVED_FLUSH - GATHER / 2  # the starved trainers' check falls due within it
    assert flush.gather() == 0
    flush.shard_opened()
    flush.fill_since = clock.now - STARVED_FILL + GATHER / 2  # ... or the draw while filling
    assert flush.gather() == 0
    flush.fill_since = clock.now
    assert flush.gather() == GATHER


def wakes_for(
    root: Path, objects: int, clock: FakeClock, monkeypatch: pytest.MonkeyPatch, *, gather: bool
) -> int:
    """Objects that come one per wake (each poll finds one, as behind a paced network) and
    three more during each gather: the writer's wakes until it has written them all."""
    root.mkdir()
    config = config_for(root)
    ctx = StopWhenConsumed(config, objects)
    writer = Writer(ctx, 0)
    writer.clock.published = FIRST_SHARDS  # past start-up: the gather applies
    if not gather:
        monkeypatch.setattr(writer.clock, "gather", lambda: 0.0)
    seqs = iter(range(objects))
    wakes = arrived = 0

    def arrive(count: int) -> None:
        nonlocal arrived
        for _, seq in zip(range(count), seqs, strict=False):
            publish(config, 0, seq, b'{"seq": %d}\n' % seq)
            arrived += 1

    def sleep(seconds: float) -> None:
        arrive(3)
        clock.now += seconds

    real_read = Watch.read

    def read(self: Watch, timeout: float | None) -> list[Event]:
        nonlocal wakes
        wakes += 1
        arrive(1)
        clock.now += 0.001
        return real_read(self, timeout)

    monkeypatch.setattr(clock, "sleep", sleep)
    monkeypatch.setattr(Watch, "read", read)
    # it waits for a full mix until the last object is in (the epoch's end, for the clock)
    monkeypatch.setattr(
        Writer, "_filling", lambda self: len(self.mixer.open) < MIX and arrived < objects
    )
    writer.run()
    assert ctx.counters["records_written"] == objects
    return wakes


def test_a_writer_fed_one_object_per_wake_takes_several_per_wake(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = 96
    with monkeypatch.context() as patch:
        one_by_one = wakes_for(tmp_path / "a", objects, clock, patch, gather=False)
    gathered = wakes_for(tmp_path / "b", objects, clock, monkeypatch, gather=True)
    assert one_by_one >= objects - MIX  # each object a wake of its own, or ...
    # ... four a wake, but where the writer had drawn every open object and waited with
    # nothing open (``Writer._idle``: that wait gathers nothing; 33 wakes here)
    assert gathered <= 0.375 * objects, f"{gathered} wakes for {objects} objects"
