"""The writer run in-process over prepared cache objects, some of them hostile: each bad
object is quarantined once (deleted from the cache, counted under its reason), none of its
records reaches a shard, every record of the healthy ones does; and a plugin whose reads of one
object never end is given up on after ``MAX_ATTEMPTS`` (the note in ``attempts.py``)."""

from __future__ import annotations

import dataclasses
import gzip
import io
import json
import random
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from prefetchd.config import Config, config_from_dict
from prefetchd.kernel.framing import frame, read_records
from prefetchd.layout import Layout, key_hash, object_name
from prefetchd.write.attempts import MAX_ATTEMPTS, ParseAttempts
from prefetchd.write.formats import get_format
from prefetchd.write.objects import ObjectReader
from prefetchd.write.writer import Writer
from tests.unit.write.writerkit import StopWhenConsumed

BUCKET = "bucket"
HERE = Path(__file__).resolve().parent


def prepare(root: Path, fmt: str, bodies: list[tuple[str, bytes]]) -> tuple[Config, list[str]]:
    config = config_from_dict(
        {
            "source": {"url": f"s3://{BUCKET}/", "format": fmt, "parse_timeout": 2},
            "epochs": {"count": 1, "seed": 3},
            "download": {"cache_dir": str(root / "cache")},
            "output": {
                "ram_dir": str(root / "ram"),
                "ram_budget": "64MiB",
                "shard_size": "64KiB",
                "writers": 1,
                "mix": 3,
                "max_record_size": "1MiB",
            },
            "status": {"state_dir": str(root / "state")},
        }
    )
    layout = Layout.of(config)
    layout.create()
    names = []
    for seq, (key, body) in enumerate(bodies):
        name = object_name(0, seq, key_hash(BUCKET, key))
        (layout.cache_meta / f"{name}.json").write_text(json.dumps({"key": key}))
        (layout.cache_ready / name).write_bytes(body)
        (root / f"source-{seq}").write_bytes(body)
        names.append(name)
    layout.downloaded_marker(0).write_text("")
    return config, names


def run(config: Config, objects: int) -> tuple[Counter[bytes], dict[str, object]]:
    ctx = StopWhenConsumed(config, objects)
    Writer(ctx, 0).run()
    records: Counter[bytes] = Counter()
    for shard in Layout.of(config).ram_ready.iterdir():
        with shard.open("rb") as f:
            records.update(read_records(f))
    return records, dict(ctx.counters)


def lines(rng: random.Random, n: int) -> bytes:
    return b"".join(b"%d %s\n" % (i, rng.randbytes(40).hex().encode()) for i in range(n))


def test_bad_objects_are_quarantined_once_with_none_of_their_records(tmp_path: Path) -> None:
    rng = random.Random(1)
    good = [(f"g/{i}.jsonl.gz", gzip.compress(lines(rng, 3000))) for i in range(4)]
    truncated = gzip.compress(lines(rng, 5000))  # 5000 good lines, then the stream stops
    bad = [
        ("b/truncated.jsonl.gz", truncated[: len(truncated) - 100]),
        ("b/long.jsonl.gz", gzip.compress(lines(rng, 4000) + b"x" * (2 * 1024**2) + b"\n")),
    ]
    bodies = [good[0], bad[0], good[1], good[2], bad[1], good[3]]
    config, _ = prepare(tmp_path, "lines", bodies)
    got, counters = run(config, len(bodies))
    fmt = get_format("lines")
    want = Counter(
        r
        for i, (key, _) in enumerate(bodies)
        if not key.startswith("b/")
        for r in fmt.records(key, str(tmp_path / f"source-{i}"))
    )
    assert got == want, "healthy records exactly once, none of the bad objects'"
    assert counters["objects_quarantined"] == 2 and counters["errors"] == 2
    assert counters["quarantined_corrupt"] == 1 and counters["quarantined_too_large"] == 1
    layout = Layout.of(config)
    assert not list(layout.cache_claimed.iterdir()), "quarantined objects left in the cache"


def test_a_non_utf8_tar_name_and_a_nonsense_pax_header_do_not_stop_the_writer(
    tmp_path: Path,
) -> None:
    """Was: UnicodeEncodeError / ValueError killed the writer five times, the daemon exited 1."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", encoding="latin-1") as tar:
        for name in ("s/\xe90.cls", "s/\xe90.t\xff", "s/1.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"1"))
    names_tar = buf.getvalue()
    record = b"22 GNU.sparse.map=x,y\n"  # tarfile: ValueError from int("x")
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type, pax.size = tarfile.XHDTYPE, len(record)
    padding = bytes(-len(record) % 512)
    nonsense = pax.tobuf(tarfile.USTAR_FORMAT) + record + padding + names_tar
    config, _ = prepare(tmp_path, "tar", [("a.tar", names_tar), ("b.tar", nonsense)])
    got, counters = run(config, 2)
    assert sum(got.values()) == 2, "both samples of the tar with non-UTF-8 names"
    assert counters["objects_quarantined"] == counters["quarantined_corrupt"] == 1


def test_a_plugin_that_never_finishes_an_object_is_given_up_after_max_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(HERE.parent.parent / "faults"))
    config, names = prepare(
        tmp_path, "hostile_plugin:records", [("a.txt", b"a one\na two\n"), ("b.txt", b"b\n")]
    )
    note = ParseAttempts(Layout.of(config).journal / "w0.parsing", clock=FakeClock())
    for _ in range(MAX_ATTEMPTS + 1):  # three writers killed for hanging while reading b.txt
        note.begin(names[1])
    got, counters = run(config, 2)
    assert got == Counter([b"a one", b"a two"]), "a.txt delivered, b.txt given up"
    assert counters["quarantined_timeout"] == 1
    assert not note.path.exists()


class FakeClock:
    """CLOCK_MONOTONIC stand-in: each reading is 40 s after the last (longer than a hang)."""

    def __init__(self, step: float = 40.0) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_only_reads_cut_short_after_a_hang_count(tmp_path: Path) -> None:
    clock = FakeClock(step=0.0)
    note = ParseAttempts(tmp_path / "w0.parsing", clock=clock)
    assert note.begin("a") == 0
    clock.now += 40  # the writer hung 40 s on "a" and was killed
    assert note.begin("a") == 1
    clock.now += 1  # then it died at once (a crash, not a hang): not counted
    assert note.begin("a") == 1
    clock.now += 40
    assert note.begin("b") == 0, "each object counts its own reads"
    note.end("b")
    assert note.begin("a") == 2, "a read of another object that ended changes nothing"
    note.end("a")
    assert not note.path.exists(), "no read cut short: no note"
    note.path.write_text("{torn")
    assert note.begin("a") == 0


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip("Linux only")


def test_tfrecord_objects_the_downloader_checked_are_not_read_through_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The downloader checks every frame's CRCs of uncompressed tfrecord input and says so in
    the meta (``records_ok``): the writer trusts that for objects no larger than
    max_record_size and reads the others (and unchecked ones) through once first."""
    rng = random.Random(5)
    # more than one read batch (1 MiB), or a format reads it whole before its first record
    body = b"".join(frame(rng.randbytes(rng.randrange(1, 40_000))) for _ in range(80))
    big = b"".join(frame(rng.randbytes(60_000)) for _ in range(90))  # over max_record_size
    bodies = [("ok.tfrecord", body), ("unchecked.tfrecord", body), ("big.tfrecord", big)]
    config, names = prepare(tmp_path, "tfrecord", bodies)
    config = dataclasses.replace(
        config, output=dataclasses.replace(config.output, max_record_size=4 * 1024**2)
    )
    assert 1024**2 < len(body) < 4 * 1024**2 < len(big)
    meta_dir = Layout.of(config).cache_meta
    for name, (key, data) in zip(names, bodies, strict=True):
        if key != "unchecked.tfrecord":
            meta = {"key": key, "size": len(data), "records_ok": True}
            (meta_dir / f"{name}.json").write_text(json.dumps(meta))
    validated: list[str] = []
    original = ObjectReader._validate

    def counting(self: ObjectReader, obj: object) -> None:
        validated.append(obj.key)  # type: ignore[attr-defined]
        original(self, obj)  # type: ignore[arg-type]

    monkeypatch.setattr(ObjectReader, "_validate", counting)
    got, counters = run(config, len(bodies))
    want = Counter(r for _, data in bodies for r in read_records(io.BytesIO(data)))
    assert got == want and counters["objects_quarantined"] == 0
    assert sorted(validated) == ["big.tfrecord", "unchecked.tfrecord"]
