"""The replayable order's claims (``write/replay.py``): objects in ``(epoch, seq)`` order
whatever order they arrive in, a missing one waited for until its epoch is downloaded, and a
skipped object's tombstone dropped unread and uncounted. Driven on a fake clock."""

from __future__ import annotations

import json
import os
from pathlib import Path

from prefetchd.child.context import ChildContext
from prefetchd.layout import Layout, key_hash, object_name, parse_object_name
from prefetchd.write.writer import Writer
from tests.unit.configs import BUCKET
from tests.unit.write.writerkit import FakeClock, lines_config, publish

BODY = b'{"a": 1}\n{"a": 2}\n'


def replay_writer(tmp_path: Path, mix: int = 8) -> Writer:
    config = lines_config(tmp_path, epochs={"count": 2, "order": "replayable"}, output={"mix": mix})
    assert config.output.writers == 1
    writer = Writer(ChildContext("writer-0", config), 0)
    writer._recover()  # a fresh start: nothing journalled, nothing claimed
    assert writer.replay is not None and writer.replay.expected == (0, 0)
    return writer


def seq_of(name: str | None) -> int | None:
    parsed = parse_object_name(name) if name is not None else None
    return parsed.seq if parsed is not None else None


def test_objects_are_claimed_in_seq_order_whatever_order_they_arrive_in(
    tmp_path: Path, clock: FakeClock
) -> None:
    writer = replay_writer(tmp_path)
    config = writer.config
    for seq in (2, 0, 3):
        publish(config, 0, seq, BODY)
    assert seq_of(writer._claim_next()) == 0
    clock.now += 10  # however long it waits, 2 does not go before 1
    assert writer._claim_next() is None
    publish(config, 0, 1, BODY)
    assert [seq_of(writer._claim_next()) for _ in range(4)] == [1, 2, 3, None]


def test_a_missing_object_is_passed_once_its_epoch_is_downloaded(
    tmp_path: Path, clock: FakeClock
) -> None:
    writer = replay_writer(tmp_path)
    config = writer.config
    for seq in (0, 2):
        publish(config, 0, seq, BODY)
    assert seq_of(writer._claim_next()) == 0
    assert writer._claim_next() is None, "1 may still come"
    Layout.of(config).downloaded_marker(0).write_text("")
    assert seq_of(writer._claim_next()) == 2


def publish_tombstone(tmp_path: Path, writer: Writer, seq: int) -> str:
    """What the downloader publishes for a skipped object in this order."""
    layout = Layout.of(writer.config)
    key = f"d/{seq:04d}.jsonl"
    name = object_name(0, seq, key_hash(BUCKET, key))
    meta = {"key": key, "epoch": 0, "skipped": True}
    (layout.cache_meta / f"{name}.json").write_text(json.dumps(meta))
    (layout.cache_tmp / name).write_bytes(b"")
    os.rename(layout.cache_tmp / name, layout.cache_ready / name)
    return name


def test_a_tombstone_takes_its_turn_and_is_dropped_unread(tmp_path: Path, clock: FakeClock) -> None:
    writer = replay_writer(tmp_path)
    config = writer.config
    layout = Layout.of(config)
    publish(config, 0, 0, BODY)
    stone = publish_tombstone(tmp_path, writer, 1)
    publish(config, 0, 2, BODY)
    writer._refill()
    assert [seq_of(o.name) for o in writer.mixer.open] == [0, 2]
    assert not (layout.cache_meta / f"{stone}.json").exists()
    assert not any(stone in n for n in os.listdir(layout.cache_claimed)), "left claimed"
    assert not any(stone in n for n in os.listdir(layout.cache_ready)), "left in ready/"
    assert writer.counters["objects_consumed"] == 0 and writer.counters["errors"] == 0


def test_the_next_epoch_starts_at_its_first_object_whatever_arrives_first(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Once epoch 0 is over, epoch 1's object 1 arriving before its object 0 waits for it
    (it used to be taken first, so a later epoch's records depended on download timing: 3 of
    22 repeated daemon runs differed from their first shard of epoch 1)."""
    writer = replay_writer(tmp_path)
    config = writer.config
    publish(config, 0, 0, BODY)
    Layout.of(config).downloaded_marker(0).write_text("")
    assert seq_of(writer._claim_next()) == 0
    publish(config, 1, 1, BODY)  # (the claims are not opened: only their order matters)
    assert writer._claim_next() is None, "object 1 of epoch 1 went before object 0"
    publish(config, 1, 0, BODY)
    claims = [writer._claim_next() for _ in range(3)]
    assert [seq_of(n) for n in claims] == [0, 1, None]
    assert all(parse_object_name(n).epoch == 1 for n in claims if n)  # type: ignore[union-attr]


def test_a_name_the_listing_kept_after_the_claim_is_passed_over(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The listing can hold a name this writer already took (inotify reported it, and it is
    merged in after the claim): its rename finds nothing, and the next object is claimed
    instead of the writer failing (which restarted it and changed the order)."""
    writer = replay_writer(tmp_path)
    config = writer.config
    first = publish(config, 0, 0, BODY)
    publish(config, 0, 1, BODY)
    assert writer._claim_next() == first
    writer.arrivals.listing.insert(0, first)  # what a late inotify event puts back
    assert seq_of(writer._claim_next()) == 1
