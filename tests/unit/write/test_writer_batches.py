"""The writer run in-process over prepared cache objects: both kernels write the same shard
bytes, TensorFlow reads every record exactly once, each object keeps its seeded order, and
the hot path runs no Python code per record (a regression guard that needs no timing)."""

from __future__ import annotations

import gzip
import io
import json
import random
import sys
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from prefetchd.config import Config, config_from_dict
from prefetchd.kernel import choice, twin
from prefetchd.kernel.framing import frame, read_records
from prefetchd.layout import Layout, key_hash, object_name
from prefetchd.seeds import object_rng
from prefetchd.write.formats import get_format, shuffled_object, shuffled_object_frames
from prefetchd.write.objects import SHUFFLE_BYTES, SHUFFLE_RECORDS, ObjectReader, OpenObject
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import StopWhenConsumed

BUCKET = "bucket"


def lines_object(rng: random.Random, n: int) -> bytes:
    return b"".join(b'{"i": %d, "t": "%s"}\r\n' % (i, b"x" * rng.randrange(90)) for i in range(n))


def tar_object(rng: random.Random, n: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(n):
            for ext, data in (("json", rng.randbytes(8 + rng.randrange(200))), ("cls", b"%d" % i)):
                info = tarfile.TarInfo(f"s/{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def tfrecord_object(rng: random.Random, n: int) -> bytes:
    return b"".join(frame(b"%d:" % i + rng.randbytes(rng.randrange(3000))) for i in range(n))


MAKERS = {
    "lines": (".jsonl", lines_object),
    "lines.gz": (".jsonl.gz", lambda r, n: gzip.compress(lines_object(r, n))),
    "tar": (".tar", tar_object),
    "raw": (".bin", lambda r, n: r.randbytes(r.randrange(50_000))),
    "tfrecord": (".tfrecord", tfrecord_object),
    "tfrecord.gz": (".tfrecord.gz", lambda r, n: gzip.compress(tfrecord_object(r, n))),
}


def prepare(
    root: Path,
    kind: str,
    objects: int,
    records: int,
    *,
    shuffle: bool = True,
    shard_size: str = "64KiB",
    mix: int = 4,
) -> tuple[Config, list[tuple[str, Path]]]:
    fmt = kind.split(".")[0]
    config = config_from_dict(
        {
            "source": {"url": f"s3://{BUCKET}/", "format": fmt},
            "epochs": {"count": 1, "seed": 3, "shuffle": shuffle},
            "download": {"cache_dir": str(root / "cache")},
            "output": {
                "ram_dir": str(root / "ram"),
                "ram_budget": "256MiB",
                "shard_size": shard_size,
                "writers": 1,
                "mix": mix,
            },
            "status": {"state_dir": str(root / "state")},
        }
    )
    layout = Layout.of(config)
    layout.create()
    suffix, make = MAKERS[kind]
    rng = random.Random(kind)
    sources = []
    for seq in range(objects):
        key = f"d/{seq:04d}{suffix}"
        name = object_name(0, seq, key_hash(BUCKET, key))
        (layout.cache_meta / f"{name}.json").write_text(json.dumps({"key": key}))
        body = make(rng, records)
        (layout.cache_ready / name).write_bytes(body)
        copy = root / f"source-{seq}"
        copy.write_bytes(body)
        sources.append((key, copy))
    layout.downloaded_marker(0).write_text("")
    return config, sources


def run_writer(config: Config, objects: int) -> list[Path]:
    ctx = StopWhenConsumed(config, objects)
    Writer(ctx, 0).run()
    assert ctx.counters["objects_consumed"] == objects
    return sorted(Layout.of(config).ram_ready.iterdir())


def shard_records(shards: list[Path]) -> list[bytes]:
    out: list[bytes] = []
    for shard in shards:
        with shard.open("rb") as f:
            out.extend(read_records(f))
    return out


def expected_records(kind: str, sources: list[tuple[str, Path]]) -> Counter[bytes]:
    fmt = get_format(kind.split(".")[0])
    return Counter(r for key, path in sources for r in fmt.records(key, str(path)))


def with_kernel(monkeypatch: pytest.MonkeyPatch, impl: Any) -> None:
    monkeypatch.setattr(choice, "KERNEL", impl)


def native_kernel() -> Any:
    if choice.KERNEL is twin:
        pytest.skip(f"the C kernel is not active: {choice.ACTIVE}")
    return choice.KERNEL


@pytest.mark.parametrize("kind", list(MAKERS))
def test_both_kernels_write_the_same_shards_read_back_by_tensorflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    native = native_kernel()
    shard_bytes = []
    for impl in (twin, native):
        with_kernel(monkeypatch, impl)
        root = tmp_path / impl.__name__
        config, sources = prepare(root, kind, objects=6, records=300)
        shards = run_writer(config, 6)
        assert len(shards) > 1, "several shards: the shard-size cut is covered too"
        shard_bytes.append([p.read_bytes() for p in shards])
        got = [
            bytes(r) for s in shards for r in tf.data.TFRecordDataset(str(s)).as_numpy_iterator()
        ]
        assert Counter(got) == expected_records(kind, sources), "every record exactly once"
    assert shard_bytes[0] == shard_bytes[1], "the same bytes from both kernels"


@pytest.mark.parametrize("kind", ["lines", "tfrecord", "tar"])
@pytest.mark.parametrize("shuffle", [True, False])
def test_each_object_keeps_its_seeded_order_and_spreads_over_the_shard(
    tmp_path: Path, kind: str, shuffle: bool
) -> None:
    """Recovery resumes an object by counting records, so its records must reach the shards
    in the order of ``shuffled_object`` (or file order); and objects are mixed."""
    config, sources = prepare(
        tmp_path, kind, objects=4, records=400, shuffle=shuffle, shard_size="64MiB"
    )
    records = shard_records(run_writer(config, 4))
    fmt = get_format(kind)
    positions = {}
    for key, path in sources:
        if shuffle:
            rng = object_rng(3, 0, key)
            bounds = {"max_records": SHUFFLE_RECORDS, "max_bytes": SHUFFLE_BYTES // 4}
            order = list(shuffled_object(fmt, key, str(path), rng, **bounds))
        else:
            order = list(fmt.records(key, str(path)))
        index = {r: i for i, r in enumerate(records)}
        got = [index[r] for r in order]
        assert got == sorted(got), f"{key}: records out of their object's order"
        positions[key] = got
    first_quarter = len(records) // 4
    assert all(sum(p < first_quarter for p in got) > 50 for got in positions.values())


def test_resuming_skips_exactly_the_journalled_count(tmp_path: Path) -> None:
    _, sources = prepare(tmp_path, "lines", objects=1, records=5000)
    key, path = sources[0]
    fmt = get_format("lines")

    def batches() -> Iterator[Any]:
        return shuffled_object_frames(fmt, key, str(path), 99, max_records=700, max_bytes=10**6)

    full = [r for f in batches() for r in f.payloads()]
    for skip in (0, 1, 699, 700, 4999, 5000, 6000):
        obj = OpenObject("n", key, 0, path, batches())
        ObjectReader.skip(obj, skip)
        rest = list(obj.frames.payloads())[obj.cursor :] + [
            r for f in obj.batches for r in f.payloads()
        ]
        assert obj.taken == min(skip, 5000)
        assert rest == full[skip:]


def test_the_hot_path_makes_no_python_call_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts every Python-level call (functions and builtins) while the writer turns 20,000
    lines into shards. Per batch there are a few dozen; per record there must be none, so a
    change that adds per-record work in Python fails here, however fast the machine."""
    with_kernel(monkeypatch, native_kernel())
    config, _ = prepare(tmp_path, "lines", objects=8, records=2500, shard_size="16MiB")
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    ctx = StopWhenConsumed(config, 8)
    writer = Writer(ctx, 0)
    sys.setprofile(count)
    try:
        writer.run()
    finally:
        sys.setprofile(None)
    records = ctx.counters["records_written"]
    assert records == 20_000
    assert calls / records < 0.5, f"{calls} Python calls for {records} records"


def test_a_small_raw_object_costs_the_writer_a_bounded_number_of_python_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 28's small objects (one record each) with ``output.mix`` 64, the user layout's:
    every Python-level call the writer makes per object, counted. A step drew ~7 records and
    then looked at all 64 open objects to see whether a frame might not fit the shard
    (``Mixer.large_ahead``), made views of all 64 to write the ~7 it drew
    (``twin.interleave_views``), and the writer parsed each object's name four times
    (``parse_object_name``): now none of that, and more per object fails here."""
    with_kernel(monkeypatch, native_kernel())
    objects = 400
    config, _ = prepare(tmp_path, "raw", objects, 1, shard_size="64MiB", mix=64)
    calls: Counter[str] = Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[frame.f_code.co_name] += 1
        elif event == "c_call":
            calls[arg.__name__] += 1

    ctx = StopWhenConsumed(config, objects)
    writer = Writer(ctx, 0)
    sys.setprofile(count)
    try:
        writer.run()
    finally:
        sys.setprofile(None)
    assert ctx.counters["records_written"] == objects
    total = sum(calls.values())
    assert calls["large_ahead"] <= objects  # one a step, and a step takes a record or more
    assert calls["parse_object_name"] <= objects, "an object's name parsed more than once"
    # a step views only the objects it picks (``twin.interleave_views``), not all 64
    assert calls["_u64"] <= 2 * objects
    # 427 calls an object before, 351 after, 284, 243 now: a step's passes over the 64 open
    # objects (``advance``, the choices' count) read a batch's length without calling
    # ``Frames.__len__`` (half of each pass's time), a claimed object's path is a str (a
    # Path was ~15 calls), its meta is decoded before ``json.loads``, and a one-record
    # object is neither seeded nor block-shuffled (``formats.one_record``); 159 since: the
    # passes over the open objects of a step (~7 records: choices' count, ``advance``, the
    # composition's slots, ``mixable``'s epoch) are comprehensions and ``map``, a constant
    # number of calls, not one or two per open object; a one-record object takes its lane
    # (``RawFormat.one_frame``: no generator, no skip), its meta is scanned by json's own
    # scanner, its source's figures are summed without ``_grow``/``__len__``; 144 now: no
    # call per pick in ``twin.interleave_views`` but its append, a claim's turn and name
    # parsed inline/in one ``group``, a finished object's meta path kept from its opening;
    # 136 now: a step's shard write makes its byte views and total by ``map`` and, when one
    # ``writev`` took it all, passes over its parts no more (``shards._write_all``), a raw
    # object's frame is made without ``Frames.of``; 134: a drained one-record object raises
    # no StopIteration, its holding is measured inline. A per-object addition, or a Python
    # call back in a pass over the open objects, shows here
    assert calls["__len__"] <= 5 * objects, "Frames.__len__ called in a pass over the objects"
    # the only seeded generator is the mixing's, once per epoch: none per one-record object
    assert calls["stable_hash"] <= 2 and calls["shuffled_frames"] == 0
    assert total / objects < 138, f"{total / objects:.0f} Python calls per object"
