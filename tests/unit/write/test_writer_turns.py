"""Writers take turns at the arrivals by seq: each takes the objects of its turn at once and
another writer's only once that one left them waiting ``STEAL_AFTER``, so no rename is made in
vain per object (the claim race), and no object waits long on a writer that is busy or down.
Driven on a fake clock: renames are counted, never timed."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd.child.context import ChildContext
from prefetchd.inotify import IN_MOVED_TO, Watch
from prefetchd.layout import Layout, parse_object_name
from prefetchd.write.arrivals import STEAL_AFTER
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import FakeClock, lines_config, publish

OBJECTS = 12


def claimed_seqs(names: list[str]) -> list[int]:
    return [parsed[1] for name in names if (parsed := parse_object_name(name))]


def claim_all(writer: Writer) -> list[str]:
    names = []
    while (name := writer._claim_next()) is not None:
        names.append(name)
    return names


@pytest.fixture
def renames(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """Renames out of ready/: "ok" or "vain" (the object was gone)."""
    counts: collections.Counter[str] = collections.Counter()
    real: Callable[..., None] = os.rename

    def rename(src: Any, dst: Any) -> None:
        if "/cache/ready/" not in str(src):
            return real(src, dst)  # not a claim (an object published, a shard)
        try:
            real(src, dst)
        except FileNotFoundError:
            counts["vain"] += 1
            raise
        counts["ok"] += 1
        return None

    monkeypatch.setattr(os, "rename", rename)
    return counts


def test_two_writers_take_their_own_turns_without_a_rename_in_vain(
    tmp_path: Path, clock: FakeClock, renames: collections.Counter[str]
) -> None:
    config = lines_config(tmp_path, epochs={}, output={"writers": 2, "mix": OBJECTS})
    writers = [Writer(ChildContext(f"writer-{i}", config), i) for i in range(2)]
    with (
        Watch(Layout.of(config).cache_ready, IN_MOVED_TO) as w0,
        Watch(Layout.of(config).cache_ready, IN_MOVED_TO) as w1,
    ):
        writers[0].arrivals.watch, writers[1].arrivals.watch = w0, w1
        taken: list[list[str]] = [[], []]
        for seq in range(OBJECTS):  # each arrival seen by both, as inotify wakes both
            publish(config, 0, seq, b'{"a": 1}\n')
            for i, writer in enumerate(writers):
                taken[i] += claim_all(writer)
            clock.now += 0.001
        assert claimed_seqs(taken[0]) == list(range(0, OBJECTS, 2))
        assert claimed_seqs(taken[1]) == list(range(1, OBJECTS, 2))
        # Long after, each writer's look at the other's turn finds it gone: no rename tried.
        clock.now += 10 * STEAL_AFTER
        assert claim_all(writers[0]) == claim_all(writers[1]) == []
    assert renames == {"ok": OBJECTS}


def test_a_writer_takes_the_turn_of_one_that_does_not_after_steal_after(
    tmp_path: Path, clock: FakeClock, renames: collections.Counter[str]
) -> None:
    config = lines_config(tmp_path, epochs={}, output={"writers": 2, "mix": OBJECTS})
    alive = Writer(ChildContext("writer-0", config), 0)  # writer-1 is busy, or down
    with Watch(Layout.of(config).cache_ready, IN_MOVED_TO) as arrivals:
        alive.arrivals.watch = arrivals
        for seq in range(OBJECTS):
            publish(config, 0, seq, b'{"a": 1}\n')
        assert claimed_seqs(claim_all(alive)) == list(range(0, OBJECTS, 2))
        clock.now += STEAL_AFTER * 1.01
        assert claimed_seqs(claim_all(alive)) == list(range(1, OBJECTS, 2))
    assert os.listdir(Layout.of(config).cache_ready) == []
    assert renames == {"ok": OBJECTS}


def test_a_single_writer_takes_every_object_at_once(tmp_path: Path, clock: FakeClock) -> None:
    config = lines_config(tmp_path, epochs={}, output={"writers": 1, "mix": OBJECTS})
    writer = Writer(ChildContext("writer-0", config), 0)
    for seq in range(OBJECTS):
        publish(config, 0, seq, b'{"a": 1}\n')
    assert claimed_seqs(claim_all(writer)) == list(range(OBJECTS))


def test_a_writer_reads_its_watch_once_per_arrival_when_it_keeps_up(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A writer that keeps up waits for each arrival (``Arrivals.wait``), claims it, and looks
    once more, finding nothing. That look read the watch again, right after the wait had read
    it to its end: a ``read`` failing with EAGAIN per object (``strace``: 0.76 per small object
    of 1.6 inotify reads; here 3 reads per arrival before). Now the look trusts the wait's
    read, and every object is still taken."""
    config = lines_config(tmp_path, epochs={}, output={"writers": 1, "mix": OBJECTS})
    writer = Writer(ChildContext("writer-0", config), 0)
    with Watch(Layout.of(config).cache_ready, IN_MOVED_TO) as watch:
        writer.arrivals.watch = watch
        assert claim_all(writer) == []  # the first look lists ready/ (and reads the watch)
        reads = 0
        read_now = watch.read_now

        def counted() -> list[Any]:
            nonlocal reads
            reads += 1
            return read_now()

        watch.read_now = counted  # type: ignore[method-assign]
        taken: list[str] = []
        for seq in range(OBJECTS):
            publish(config, 0, seq, b'{"a": 1}\n')
            writer.arrivals.wait(1.0)
            taken += claim_all(writer)
            clock.now += 0.001
        assert claimed_seqs(taken) == list(range(OBJECTS))
        assert reads == OBJECTS, f"{reads} reads of the watch for {OBJECTS} arrivals"
        # without a wait before it (a writer busy writing), a look reads the watch as before
        publish(config, 0, OBJECTS, b'{"a": 1}\n')
        assert claimed_seqs(claim_all(writer)) == [OBJECTS]
        assert reads == OBJECTS + 2  # its read that found it, and the one that found nothing
