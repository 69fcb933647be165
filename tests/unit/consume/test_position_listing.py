"""A trainer's position names the listing its epoch was laid out over (``objects.listing``),
read from ``state_dir/epochs/<k>.listing`` once per epoch, not once per shard it covers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefetchd.consume.stream_position import StreamPosition, parse_position
from prefetchd.exactly_once.trained_objects import ListingId
from prefetchd.layout import Layout, claim_name, object_name, shard_name
from prefetchd.messages.shard_mix import ShardMix, ShardPart


def _shard(layout: Layout, epoch: int, counter: int, seq: int) -> str:
    """A claimed shard of ``epoch`` holding all 3 records of object ``seq``, and its mix."""
    shard = shard_name(epoch, 0, counter)
    part = ShardPart(object_name(epoch, seq, "ab" * 12), 0, 3, True)
    layout.shard_mix(shard).write_bytes(ShardMix((part,), ()).encode())
    claimed = claim_name("1x1", shard)
    (layout.ram_claimed / claimed).write_bytes(b"")
    return claimed


def test_a_position_carries_its_epochs_listing_read_once_per_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    listings = {e: ListingId(40 + e, f"{e:016x}") for e in (0, 1)}
    for epoch, listing in listings.items():
        layout.epoch_listing(epoch).write_text(json.dumps(listing.to_json()))
    reads: list[Path] = []
    read_bytes = Path.read_bytes

    def counting(path: Path) -> bytes:
        reads.append(path)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counting)
    stream = StreamPosition(layout, parse_position({}))
    saved = []
    for epoch, counter, seq in [(0, 1, 0), (0, 2, 1), (0, 3, 2), (1, 4, 0), (1, 5, 1)]:
        stream.epoch = epoch  # as ready_files() sets it, reading the epoch
        stream.yielded(_shard(layout, epoch, counter, seq))
        saved.append(stream.position(None, 0))
    assert [p["objects"]["listing"] for p in saved] == [listings[0].to_json()] * 3 + [
        listings[1].to_json()
    ] * 2
    assert saved[2]["objects"]["done"] == [[0, 3]] and saved[4]["objects"]["done"] == [[0, 2]]
    listing_reads = [p for p in reads if p.parent == layout.epochs]
    assert sorted(listing_reads) == [layout.epoch_listing(0), layout.epoch_listing(1)]


def test_a_position_of_an_epoch_laid_out_by_an_earlier_release_names_no_listing(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    stream = StreamPosition(layout, parse_position({}))
    stream.yielded(_shard(layout, 0, 1, 0))
    objects = stream.position(None, 0)["objects"]
    assert objects["done"] == [[0, 1]] and "listing" not in objects
