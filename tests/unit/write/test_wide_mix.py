"""A wide mix (``output.mix`` 64 by default) at the memory and per-record cost of a narrow one.

An open uncompressed TFRecord object is read in smaller batches as ``mix`` grows (its order is
its own, whole-object shuffle, whatever the batch); a block shuffle keeps its block and a writer
stops opening objects once they hold ``MIX_MEMORY``; and what the open objects hold is counted
as batches change, not by a pass over all of them each step (the counts must match a recount)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from prefetchd.config import Config, OutputConfig
from prefetchd.kernel.example_encode import encode_example
from prefetchd.kernel.framing import frame, read_records
from prefetchd.layout import Layout, key_hash, object_name
from prefetchd.write import writer as writer_module
from prefetchd.write.formats import get_format, object_frames
from prefetchd.write.objects import MIX_MEMORY, batch_bytes, shuffle_bytes
from prefetchd.write.writer import Writer
from tests.unit.configs import BUCKET
from tests.unit.write import test_writer_memory as memory
from tests.unit.write.writerkit import lines_config

KIB, MIB = 1024, 1024**2


def test_the_default_mix_is_wide_and_its_batches_and_blocks_are_sized_for_it() -> None:
    assert OutputConfig().mix == 64
    assert batch_bytes(8) == MIB and batch_bytes(16) == 512 * KIB
    assert batch_bytes(64) == batch_bytes(4096) == 128 * KIB  # 8 MiB per writer at mix 64
    assert shuffle_bytes(1) == 32 * MIB and shuffle_bytes(4) == 8 * MIB
    assert shuffle_bytes(8) == shuffle_bytes(64) == shuffle_bytes(4096) == 4 * MIB


def test_a_tfrecord_object_read_in_smaller_batches_keeps_its_order(tmp_path: Path) -> None:
    """The batch size only cuts the object's seeded whole-object order into pieces."""
    path = tmp_path / "o.tfrecord"
    path.write_bytes(
        b"".join(frame(encode_example({"i": i, "p": b"x" * 300})) for i in range(3000))
    )
    wide, narrow = (get_format("tfrecord", batch_bytes=b) for b in (64 * KIB, MIB))
    small = list(wide.shuffled_frames("o.tfrecord", str(path), 7))  # type: ignore[attr-defined]
    large = list(narrow.shuffled_frames("o.tfrecord", str(path), 7))  # type: ignore[attr-defined]
    assert len(small) > len(large) == 1
    assert all(len(f.data) < 64 * KIB + 400 for f in small)  # a batch ends past the limit
    assert [p for f in small for p in f.payloads()] == [p for f in large for p in f.payloads()]
    in_file = [p for f in object_frames(wide, "o.tfrecord", str(path)) for p in f.payloads()]
    assert sorted(in_file) == sorted(p for f in large for p in f.payloads())


class Recount(memory.HeldCounter):
    """At every turn of the writer's loop, the mixer's running counts against a recount over
    its open objects; also the most objects open at once."""

    def __init__(self, config: Config, objects: int) -> None:
        super().__init__(config, objects)
        self.turns = 0
        self.max_open = 0

    def should_stop(self) -> bool:
        writer = self.writer
        if writer is not None:
            mixer = writer.mixer
            self.turns += 1
            self.max_open = max(self.max_open, len(mixer.open))
            assert mixer.held_bytes() == sum(o.held() for o in mixer.open)
            assert mixer.holding_large() == any(o.held() > mixer.normal_hold for o in mixer.open)
            frames = sum(len(o.frames) for o in mixer.open)
            data = sum(len(o.frames.data) for o in mixer.open)
            assert (mixer.batch_frames, mixer.batch_bytes) == (frames, data)
            assert mixer.waiting == sum(o.waiting for o in mixer.open)
        return super().should_stop()


def run(config: Config, objects: int) -> tuple[Recount, Counter[bytes]]:
    ctx = Recount(config, objects)
    ctx.writer = Writer(ctx, 0)
    ctx.writer.run()
    assert ctx.counters["objects_consumed"] == objects
    got: Counter[bytes] = Counter()
    for shard in sorted(Layout.of(config).ram_ready.iterdir()):
        with shard.open("rb") as f:
            got.update(bytes(r) for r in read_records(f))
    return ctx, got


def test_the_running_counts_match_a_recount_with_large_records_parked(tmp_path: Path) -> None:
    """The hardest case for the counts: objects holding records near the limit, parked and
    let go one at a time (test_writer_memory.py), every record still exactly once."""
    config, sources = memory.prepare(tmp_path, 6, 4)
    ctx, got = run(config, 6)
    assert got == memory.expected(sources, 4)
    assert ctx.max_large == 1 and ctx.turns > 10


def lines_objects(root: Path, config: Config, count: int, lines: int) -> Counter[bytes]:
    """``count`` JSONL objects of ``lines`` lines into ready/; the records they hold."""
    layout = Layout.of(config)
    fmt = get_format("lines")
    want: Counter[bytes] = Counter()
    for seq in range(count):
        key = f"d/{seq:04d}.jsonl"
        name = object_name(0, seq, key_hash(BUCKET, key))
        pad = b"p" * 80
        body = b"".join(b'{"o": %d, "i": %d, "pad": "%s"}\n' % (seq, i, pad) for i in range(lines))
        source = root / f"source-{seq}"
        source.write_bytes(body)
        want.update(fmt.records(key, str(source)))
        (layout.cache_meta / f"{name}.json").write_text(json.dumps({"key": key}))
        (layout.cache_ready / name).write_bytes(body)
    layout.downloaded_marker(0).write_text("")
    return want


@pytest.mark.parametrize("cap", [3 * MIB, MIX_MEMORY])
def test_a_writer_opens_objects_only_while_they_hold_less_than_mix_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cap: int
) -> None:
    """With ``mix`` 64 and block-shuffled objects of ~1 MiB, a writer opens objects while its
    open ones hold less than ``MIX_MEMORY`` (made 3 MiB here), so it holds at most that plus
    one object's batches; with the real ``MIX_MEMORY`` all 12 fit. Every record arrives."""
    monkeypatch.setattr(writer_module, "MIX_MEMORY", cap)
    config = lines_config(
        tmp_path,
        epochs={"count": 1, "seed": 3, "shuffle": True},
        output={"writers": 1, "mix": 64, "shard_size": "32MiB", "ram_budget": "256MiB"},
    )
    want = lines_objects(tmp_path, config, 12, 9000)
    ctx, got = run(config, 12)
    assert got == want, "every record exactly once"
    writer = ctx.writer
    assert writer is not None
    if cap < MIX_MEMORY:
        assert 2 <= ctx.max_open < 12, ctx.max_open
        assert ctx.max_held < cap + writer.mixer.normal_hold
    else:
        assert ctx.max_open == 12
