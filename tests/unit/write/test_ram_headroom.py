"""Regression: a later epoch's shards must leave the oldest incomplete epoch enough of the RAM
budget for a trainer that keeps several shards at once.

A resumable trainer (``ready_files(..., position=...)``) keeps on the RAM disk the shards its
last checkpoint covers until its next ``position()`` — with a checkpoint every two shards it
holds three while it waits for the fourth. Shards of the next epoch, which no trainer reads
before this one ends, used to take all of the budget but ``writers x chunk``: the writer of the
oldest epoch then had no room for the shard the trainer waited for, and the trainer no way to
free any (the soak's trainer checkpoints every two shards). Two real writers use one budget
here; the trainer's claims are renames, as ``ready_files()`` makes them. A writer that would
wait for room raises ``Interrupted`` (its stop flag is set), so nothing blocks: the test counts.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefetchd.budget import Interrupted
from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.layout import Layout, claim_name
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import lines_config, publish

KIB = 1024
SHARD = 128 * KIB
BUDGET = 1024 * KIB
TRAINER = "4242x0000abcd"  # a claim owner, as ready_files() names them


@pytest.fixture
def config(tmp_path: Path) -> Config:
    output = {"ram_budget": BUDGET, "shard_size": SHARD, "writers": 2, "mix": 2}
    return lines_config(tmp_path, epochs={"count": 2, "seed": 1}, output=output)


def arrive(config: Config, epoch: int, seq: int) -> None:
    """Object ``seq`` of ``epoch``: 1,000 lines of 1 KiB, published into ready/."""
    publish(config, epoch, seq, b'{"pad": "%s"}\n' % (b"x" * 1000) * 1000)


def stopping_writer(config: Config, index: int) -> Writer:
    """Writer ``index`` after start-up; one that would wait for RAM raises ``Interrupted``."""
    ctx = ChildContext(f"writer-{index}", config)
    writer = Writer(ctx, index)
    writer._recover()
    ctx.stopping = True
    return writer


def publish_shard(writer: Writer) -> bool:
    """Write one full shard and publish it; False if the RAM budget had no room for it."""
    try:
        for _ in range(50):
            writer._step()
            if writer.publisher.shard is not None and writer.publisher.shard.size >= SHARD:
                writer.publisher.publish()
                return True
    except Interrupted:
        return False
    raise AssertionError("50 steps did not fill a shard")


def trainer_claims(layout: Layout) -> list[str]:
    """A trainer claims every ready shard of epoch 0 (and, resumable, keeps them)."""
    names = sorted(n for n in os.listdir(layout.ram_ready) if n.startswith("e00000-"))
    for name in names:
        os.rename(layout.ram_ready / name, layout.ram_claimed / claim_name(TRAINER, name))
    return names


def test_a_trainer_keeping_its_checkpointed_shards_still_gets_the_next_one(
    config: Config,
) -> None:
    layout = Layout.of(config)
    oldest, later = stopping_writer(config, 0), stopping_writer(config, 1)
    for seq in (0, 2):  # writer 0's turn (seq % 2 == 0): it takes them at once
        arrive(config, 0, seq)
    oldest._refill()
    layout.downloaded_marker(0).write_text("{}")  # epoch 0 is all in hand: writer 1 moves on
    for seq in range(4):
        arrive(config, 1, seq)
    later._refill()
    assert {o.epoch for o in oldest.mixer.open} == {0} and {o.epoch for o in later.mixer.open} == {
        1
    }

    assert publish_shard(oldest)
    kept = trainer_claims(layout)  # the trainer reads the first shard ...
    later_shards = 0
    while publish_shard(later):  # ... while the next epoch's shards take what they may
        later_shards += 1
    assert later_shards > 0, "the next epoch still gets shards ready ahead"
    for _ in range(3):  # checkpoint after the second shard, read the third, wait for a fourth
        assert publish_shard(oldest), (
            f"no room for epoch 0's next shard: the trainer keeps {len(kept)} shards, the "
            f"next epoch's {later_shards} take the rest of the budget"
        )
        kept += trainer_claims(layout)
    used = sum(
        e.stat().st_size for d in ("ready", "claimed", ".tmp") for e in os.scandir(layout.ram / d)
    )
    assert used <= BUDGET
