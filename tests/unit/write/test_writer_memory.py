"""The writer's memory bound, counted in-process (docs/reliability.md, "Records near the
limit"): whatever ``output.mix`` is, at most one of a writer's open objects holds a large
record's batch at a time, so the bytes its open objects hold stay within ``mix`` times
``normal_hold`` plus one ``max_record_size``; every record still arrives exactly once, and
records well under a batch mix as before."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from prefetchd.child.context import ChildContext
from prefetchd.config import Config, config_from_dict
from prefetchd.kernel import choice
from prefetchd.kernel.framing import read_records
from prefetchd.layout import Layout, key_hash, object_name, writer_claim_name
from prefetchd.write.formats import get_format
from prefetchd.write.frames import Frames
from prefetchd.write.mixing import Mixer
from prefetchd.write.objects import OpenObject
from prefetchd.write.shuffle import Holding, shuffled_frames
from prefetchd.write.writer import Writer

BUCKET = "bucket"
MIB = 1024**2


def big_line(mix: int) -> int:
    """A line just over what an open object normally holds (``Mixer.normal_hold``: twice
    its shuffle block plus two input batches; 10 MiB with mix 8, 18 MiB with mix 4)."""
    return 2 * max(256 * 1024, 32 * MIB // mix) + 3 * MIB


def max_record(mix: int) -> int:
    return big_line(mix) + MIB


class HeldCounter(ChildContext):
    """Counts, at every turn of the writer's loop, the bytes its open objects hold and how many
    of them hold more than ``normal_hold``; stops once every object is consumed."""

    def __init__(self, config: Config, objects: int) -> None:
        super().__init__("writer-0", config)
        self.objects = objects
        self.writer: Writer | None = None
        self.max_held = 0
        self.max_large = 0

    def should_stop(self) -> bool:
        writer = self.writer
        if writer is not None:
            self.max_held = max(self.max_held, writer.mixer.held_bytes())
            large = sum(o.held() > writer.mixer.normal_hold for o in writer.mixer.open)
            self.max_large = max(self.max_large, large)
        consumed = self.counters.get("objects_consumed", 0)
        return isinstance(consumed, int) and consumed >= self.objects


def big_lines_object(seq: int, size: int, *, big_first: bool = False) -> bytes:
    """Small lines around one line of ``size`` bytes (its letter names the object), or that
    line first: then the object's first batch holds it."""
    small = b"".join(b'{"o": %d, "i": %d}\n' % (seq, i) for i in range(200))
    big = bytes([65 + seq]) * size + b"\n"
    return big + small + small if big_first else small + big + small


def prepare(
    root: Path, objects: int, mix: int, *, big_first: bool = False
) -> tuple[Config, list[tuple[str, Path]]]:
    config = config_from_dict(
        {
            "source": {"url": f"s3://{BUCKET}/", "format": "lines"},
            "epochs": {"count": 1, "seed": 5, "shuffle": True},
            "download": {"cache_dir": str(root / "cache")},
            "output": {
                "ram_dir": str(root / "ram"),
                "ram_budget": "512MiB",
                "shard_size": "32MiB",
                "writers": 1,
                "mix": mix,
                "max_record_size": max_record(mix),
            },
            "status": {"state_dir": str(root / "state")},
        }
    )
    layout = Layout.of(config)
    layout.create()
    sources = []
    for seq in range(objects):
        key = f"d/{seq:04d}.jsonl"
        name = object_name(0, seq, key_hash(BUCKET, key))
        (layout.cache_meta / f"{name}.json").write_text(json.dumps({"key": key}))
        body = big_lines_object(seq, big_line(mix), big_first=big_first)
        (layout.cache_ready / name).write_bytes(body)
        copy = root / f"source-{seq}"
        copy.write_bytes(body)
        sources.append((key, copy))
    layout.downloaded_marker(0).write_text("")
    return config, sources


def run_counted(config: Config, objects: int) -> tuple[HeldCounter, Counter[bytes]]:
    ctx = HeldCounter(config, objects)
    writer = ctx.writer = Writer(ctx, 0)
    writer.run()
    assert ctx.counters["objects_consumed"] == objects
    got: Counter[bytes] = Counter()
    for shard in sorted(Layout.of(config).ram_ready.iterdir()):
        with shard.open("rb") as f:
            got.update(bytes(r) for r in read_records(f))
    return ctx, got


def expected(sources: list[tuple[str, Path]], mix: int) -> Counter[bytes]:
    fmt = get_format("lines", max_record_size=max_record(mix))
    return Counter(r for key, path in sources for r in fmt.records(key, str(path)))


@pytest.mark.parametrize("mix", [4, 8])
def test_a_writer_holds_one_large_record_at_a_time_whatever_the_mix(
    tmp_path: Path, mix: int
) -> None:
    """Was: each open object held its current batch, so a writer with ``mix`` objects made of
    records near the limit held ``mix`` of them (639 MiB peak RSS with mix 4, bound 528)."""
    objects = mix + 2
    config, sources = prepare(tmp_path, objects, mix)
    ctx, got = run_counted(config, objects)
    assert got == expected(sources, mix), "every record exactly once"
    assert ctx.max_large == 1, "one large batch at a time, and the count saw it"
    writer = ctx.writer
    assert writer is not None
    assert writer.mixer.normal_hold < big_line(mix), "the lines are large for this mix"
    bound = (mix - 1) * writer.mixer.normal_hold + max_record(mix) + writer.mixer.normal_hold
    assert ctx.max_held <= bound, f"held {ctx.max_held / MIB:.0f} MiB > {bound / MIB:.0f} MiB"
    assert ctx.max_held < 2 * big_line(mix), "never two large lines at once"


def test_without_the_bound_the_count_sees_several_large_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counting above can tell: with the rule switched off, a writer with ``mix`` 4 holds
    several large records at once (what ``docs/reliability.md`` measured before)."""
    monkeypatch.setattr(Mixer, "may_fetch", lambda self, obj: True)
    monkeypatch.setattr(Mixer, "holding_large", lambda self: False)
    config, sources = prepare(tmp_path, 6, 4)
    ctx, got = run_counted(config, 6)
    assert got == expected(sources, 4)
    assert ctx.max_large >= 2, ctx.max_large
    assert ctx.max_held >= 2 * big_line(4)


def test_after_a_restart_claimed_objects_are_read_one_large_record_at_a_time(
    tmp_path: Path,
) -> None:
    """A restarted writer reopens every object it had claimed at once; those whose first batch
    would hold a large record wait until no other does (and every record still arrives)."""
    mix = 4
    config, sources = prepare(tmp_path, mix, mix, big_first=True)
    layout = Layout.of(config)
    for entry in sorted(layout.cache_ready.iterdir()):  # claimed by writer 0 before a crash
        entry.rename(layout.cache_claimed / writer_claim_name(0, entry.name))
    ctx, got = run_counted(config, mix)
    assert got == expected(sources, mix), "every record exactly once"
    assert ctx.max_large == 1, ctx.max_large
    assert ctx.max_held < 2 * big_line(mix)


def test_objects_that_all_wait_go_on_anyway_one_after_another(tmp_path: Path) -> None:
    """Liveness over the bound: if every object of the oldest epoch waits while an object of a
    later epoch (only after a restart) holds a large batch, they are read anyway, one at a
    time, each drained or given its batch; none is left parked with nothing to mix."""
    config, _ = prepare(tmp_path, 0, 4)
    writer = Writer(HeldCounter(config, 0), 0)
    large = Frames.of(*choice.KERNEL.frame_records([bytes(writer.mixer.normal_hold)]))
    later = OpenObject("later", "k", 1, tmp_path / "x", iter([]), frames=large)
    empty = [OpenObject(f"e{i}", "k", 0, tmp_path / "x", iter([]), waiting=True) for i in range(2)]
    small = Frames.of(*choice.KERNEL.frame_records([b"r"]))
    last = OpenObject("last", "k", 0, tmp_path / "x", iter([small]), waiting=True)
    writer.mixer.take_over([*empty, last, later])
    writer.mixer.resume_waiting()
    assert [o.name for o in writer.mixer.finished] == ["e0", "e1"], "drained, one after another"
    assert writer.mixer.open == [last, later] and not last.waiting and len(last.frames) == 1
    assert writer.mixer.mixable() == [last]


def test_the_block_shuffle_holds_a_large_record_once_and_says_what_it_keeps() -> None:
    """A large record cut out of an input batch goes on alone and the input batch is let go
    (cut down to its rest): the shuffle's ``Holding`` stays small while the writer holds the
    record's batch; the order is that of the shuffle without the meter."""
    big = bytes(8 * MIB)
    records = [b"a%d" % i for i in range(50)] + [big] + [b"z%d" % i for i in range(50)]
    batches = [Frames.of(*choice.KERNEL.frame_records(records))]
    holding = Holding()
    bounds = {"max_records": 1000, "max_bytes": 64 * 1024}
    seen = []
    for out in shuffled_frames(iter(batches), 7, **bounds, holding=holding):
        seen.append((list(out.payloads()), holding.bytes))
    with_big = [kept for payloads, kept in seen if big in payloads]
    assert with_big == [with_big[0]] and with_big[0] < MIB, "the input batch was cut down"
    plain = shuffled_frames(iter(batches), 7, max_records=1000, max_bytes=64 * 1024)
    assert [p for p, _ in seen] == [list(o.payloads()) for o in plain], "the same order"
