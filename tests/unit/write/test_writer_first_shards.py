"""When a writer publishes a partial shard and when it draws before ``output.mix`` objects are
open: at start-up a waiting trainer gets the first ``FIRST_SHARDS`` shards of every writer at
once, drawn from what is there; later shards wait to fill and to age as before. Driven step by
step on a fake clock: the decisions are counted, never timed."""

from __future__ import annotations

import os
import random
from pathlib import Path

from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.inotify import Event, Watch
from prefetchd.kernel.framing import read_records
from prefetchd.layout import Layout
from prefetchd.write.flush import FIRST_SHARDS, STARVED_FILL, STARVED_FLUSH, STARVED_FLUSH_MAX
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import FakeClock, lines_config, publish

LINES = 8000  # ~3.4 MiB per object: several steps (STEP_BYTES) each


def prepare(root: Path, objects: int, *, lines: int = LINES) -> Config:
    """``objects`` JSONL objects of ``lines`` lines in the cache, a writer config with mix 4
    and shards far larger than the input (only the early-publish rules can cut a shard)."""
    output = {"ram_budget": "256MiB", "shard_size": "64MiB", "writers": 1, "mix": 4}
    config = lines_config(root, epochs={"count": 1, "seed": 1, "shuffle": True}, output=output)
    rng = random.Random(objects)
    for seq in range(objects):
        body = b"".join(b'{"o": %d, "i": %d, "pad": "%s"}\n' % (seq, i, b"x" * rng.randrange(800))
                        for i in range(lines))  # fmt: skip
        publish(config, 0, seq, body)
    return config


def writer_for(config: Config) -> tuple[Writer, Layout]:
    writer = Writer(ChildContext("writer-0", config), 0)
    writer._recover()
    return writer, Layout.of(config)


def trainer_claims_all(layout: Layout) -> int:
    """What a waiting trainer does: take every ready shard out of ready/ (records counted)."""
    records = 0
    for shard in sorted(layout.ram_ready.iterdir()):
        with shard.open("rb") as f:
            records += sum(1 for _ in read_records(f))
        os.rename(shard, layout.ram_claimed / f"t-{shard.name}")
    return records


def step_and_decide(writer: Writer) -> bool:
    """Turns of the writer's loop until it has written records (a step stops early at an
    object whose batch ran out, e.g. a newly opened one), then its publish decision."""
    for _ in range(8):
        writer._step()
        if writer.publisher.shard is not None and writer.publisher.shard.records > 0:
            return writer.clock.trainers_starved()
    raise AssertionError("eight steps wrote nothing")


def test_the_first_shards_go_out_after_one_step_each_while_trainers_wait(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Regression: behind a paced store the first shard waited 0.25 s to fill and 0.5 s to
    age, and ``prefetchd.tf.dataset`` waits for four shards: 0.75-1 s of a 2-3 s first batch."""
    writer, layout = writer_for(prepare(tmp_path, objects=1))
    writer._refill()
    assert len(writer.mixer.open) == 1 < writer.config.output.mix
    assert not writer._filling(), "no wait to fill while the trainers have nothing to read"
    delivered = 0
    for published in range(FIRST_SHARDS):
        assert step_and_decide(writer), f"shard {published + 1} goes out with no time passed"
        writer.publisher.publish()
        delivered += trainer_claims_all(layout)
    assert writer.clock.published == FIRST_SHARDS
    assert 0 < delivered < LINES, "small shards: records reach the trainer before the object ends"
    assert not step_and_decide(writer), "later shards age first"
    clock.now += STARVED_FLUSH
    assert writer.clock.trainers_starved(), "... and go out once STARVED_FLUSH old"


def test_no_early_shard_while_a_shard_is_ready(tmp_path: Path, clock: FakeClock) -> None:
    """A trainer with a shard to read is not waiting: the writer fills its shard instead."""
    writer, layout = writer_for(prepare(tmp_path, objects=1))
    (layout.ram_ready / "e00000-w01-0000000.tfrecord").write_bytes(b"")
    writer._refill()
    assert writer._filling(), "a trainer has something to read: wait for more objects"
    clock.now += STARVED_FILL
    assert writer._filling(), "... however long the shard there lasts it (until FILL_WAIT)"
    assert not step_and_decide(writer)
    clock.now += STARVED_FLUSH
    assert not writer.clock.trainers_starved()


def test_while_trainers_stay_starved_early_shards_age_longer_and_a_ready_shard_resets_that(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A trainer waiting on the download reads at its pace whatever the shards' size, but
    pays per shard: early shards come every 0.2, 0.4, 0.8, then 1.0 s, not five a second."""
    writer, layout = writer_for(prepare(tmp_path, objects=2))
    writer.clock.published = FIRST_SHARDS
    writer._refill()
    ages = []
    for _ in range(5):
        assert not step_and_decide(writer)
        waited = 0.0
        while not writer.clock.trainers_starved():
            clock.now += 0.05
            waited += 0.05
            assert waited < 2 * STARVED_FLUSH_MAX, "an early shard must still go out"
        ages.append(round(waited, 2))
        writer.publisher.publish()
        trainer_claims_all(layout)
    expected = [0.2, 0.4, 0.8, 1.0, 1.0]  # to one clock tick of 0.05 s
    assert all(e <= a <= e + 0.051 for a, e in zip(ages, expected, strict=True)), ages
    assert not step_and_decide(writer)
    (layout.ram_ready / "e00000-w01-0000000.tfrecord").write_bytes(b"")  # the trainer has one
    clock.now += STARVED_FLUSH_MAX
    assert not writer.clock.trainers_starved()
    os.unlink(layout.ram_ready / "e00000-w01-0000000.tfrecord")
    clock.now += STARVED_FLUSH
    assert writer.clock.trainers_starved(), "starved anew: the first early shard comes quickly"


def test_after_the_first_shards_a_starved_writer_waits_starved_fill_to_mix(
    tmp_path: Path, clock: FakeClock
) -> None:
    writer, _ = writer_for(prepare(tmp_path, objects=1))
    writer.clock.published = FIRST_SHARDS  # as if this process had given its first shards
    writer._refill()
    assert writer._filling(), "mixing first: fewer than output.mix objects are open"
    clock.now += STARVED_FILL
    assert not writer._filling(), "the trainers waited STARVED_FILL: draw from what is open"


def test_an_idle_writer_gives_a_waiting_trainer_its_records(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Nothing open (its objects written, more still downloading): a shard the trainers wait
    for goes out at once during start-up, not IDLE_FLUSH after the last input."""
    writer, layout = writer_for(prepare(tmp_path, objects=1, lines=50))
    writer.arrivals.watch = NoArrivals()
    writer._refill()
    assert not writer._filling()
    while writer.mixer.open:
        writer._step()
    writer._idle()
    assert writer.clock.published == 1
    assert trainer_claims_all(layout) == 50, "every record of the object, in one shard"


class NoArrivals(Watch):
    """The writer's watch of ``cache/ready``: nothing arrives (``read`` returns at once)."""

    def __init__(self) -> None:
        pass  # no inotify descriptor: nothing is watched

    def read(self, timeout: float | None) -> list[Event]:
        return []

    def read_now(self) -> list[Event]:
        return []
