"""The ``lines`` and ``tar`` formats, compressed input and GZIP shards, read back with real
TensorFlow and compared with the source."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
import tracemalloc
from pathlib import Path

import pytest
import tensorflow as tf
import zstandard

from prefetchd.budget import RamBudget
from prefetchd.errors import CorruptObject
from prefetchd.kernel.framing import frame
from prefetchd.layout import Layout
from prefetchd.write.formats import get_format
from prefetchd.write.formats.compressed import zstd_problem
from prefetchd.write.formats.tar import split_member
from prefetchd.write.shards import ShardFile

LINES_SPEC = {
    "key": tf.io.FixedLenFeature([], tf.string),
    "line_number": tf.io.FixedLenFeature([], tf.int64),
    "data": tf.io.FixedLenFeature([], tf.string),
}


def through_tensorflow(path: Path, records: list[bytes]) -> list[bytes]:
    """Frame ``records`` into a TFRecord file and read them back with TensorFlow."""
    path.write_bytes(b"".join(frame(r) for r in records))
    return [r.numpy() for r in tf.data.TFRecordDataset(str(path))]


def compress(data: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(data)
    if suffix == ".zst":
        return zstandard.ZstdCompressor(write_checksum=True).compress(data)
    return data


# --- lines ------------------------------------------------------------------------------------

JSONL = b'{"a": 1}\n{"b": "\xc3\xbc"}\r\n\n{"c": [1, 2]}\n   \nno newline at the end'


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_lines_format_one_example_per_line_read_by_tensorflow(tmp_path: Path, suffix: str) -> None:
    key = f"logs/part-0.jsonl{suffix}"
    obj = tmp_path / "obj"
    obj.write_bytes(compress(JSONL, suffix))
    records = list(get_format("lines").records(key, str(obj)))
    got = [
        tf.io.parse_single_example(r, LINES_SPEC)
        for r in through_tensorflow(tmp_path / "s.tfrecord", records)
    ]
    source = JSONL.split(b"\n")
    expected = [
        (n, line.removesuffix(b"\r")) for n, line in enumerate(source, 1) if line.strip(b"\r")
    ]
    assert [(int(x["line_number"]), x["data"].numpy()) for x in got] == expected
    assert {x["key"].numpy() for x in got} == {key.encode()}
    assert expected[-1] == (6, b"no newline at the end")  # blank lines keep their numbers


def test_lines_format_csv_header_is_line_one(tmp_path: Path) -> None:
    obj = tmp_path / "obj"
    obj.write_bytes(b"id,label\n1,cat\n2,dog\n")
    records = list(get_format("lines").records("t.csv", str(obj)))
    parsed = [tf.io.parse_single_example(r, LINES_SPEC) for r in records]
    assert [(int(p["line_number"]), p["data"].numpy()) for p in parsed] == [
        (1, b"id,label"),
        (2, b"1,cat"),
        (3, b"2,dog"),
    ]


# --- tar (WebDataset) -------------------------------------------------------------------------


def make_tar(members: list[tuple[str, bytes]], extra_dir: bool = True) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if extra_dir:
            info = tarfile.TarInfo("train")
            info.type = tarfile.DIRTYPE
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def webdataset_samples(count: int, seed: int) -> dict[str, dict[str, bytes]]:
    rng = random.Random(seed)
    return {
        f"train/n{i:05d}": {
            "jpg": rng.randbytes(rng.randrange(1, 5000)),
            "cls": str(i % 10).encode(),
            "meta.json": b'{"i": %d}' % i,
        }
        for i in range(count)
    }


def test_split_member_follows_webdataset() -> None:
    assert split_member("a/b/c.seg.png") == ("a/b/c", "seg.png")
    assert split_member("x.jpg") == ("x", "jpg")
    assert split_member("dir.v2/x.jpg") == ("dir.v2/x", "jpg")
    assert split_member("README") is None
    assert split_member("dir/.hidden") is None


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_tar_format_one_example_per_sample_read_by_tensorflow(tmp_path: Path, suffix: str) -> None:
    samples = webdataset_samples(20, seed=1)
    members = [(f"{k}.{ext}", v) for k, exts in samples.items() for ext, v in exts.items()]
    members.append(("train/NOTES", b"no extension: skipped"))
    obj = tmp_path / "obj"
    obj.write_bytes(compress(make_tar(members), suffix))
    records = list(get_format("tar").records(f"shards/s-000.tar{suffix}", str(obj)))
    spec = {
        name: tf.io.FixedLenFeature([], tf.string) for name in ("key", "jpg", "cls", "meta.json")
    }
    got = {}
    for raw in through_tensorflow(tmp_path / "s.tfrecord", records):
        parsed = tf.io.parse_single_example(raw, spec)
        assert set(tf.train.Example.FromString(raw).features.feature) == set(spec)
        got[parsed["key"].numpy().decode()] = {
            ext: parsed[ext].numpy() for ext in ("jpg", "cls", "meta.json")
        }
    assert got == samples
    assert list(got) == list(samples), "samples come in tar order"


def test_tar_format_sample_with_the_same_extension_twice_is_corrupt(tmp_path: Path) -> None:
    obj = tmp_path / "obj"
    obj.write_bytes(make_tar([("a.jpg", b"1"), ("a.cls", b"2"), ("a.jpg", b"3")]))
    with pytest.raises(CorruptObject, match="appears twice"):
        list(get_format("tar").records("s.tar", str(obj)))


@pytest.mark.parametrize("cut", [100, 700, 1500])
def test_truncated_tar_is_corrupt_naming_the_key(tmp_path: Path, cut: int) -> None:
    data = make_tar([("a.bin", b"x" * 1000), ("b.bin", b"y" * 1000)], extra_dir=False)
    obj = tmp_path / "obj"
    obj.write_bytes(data[:cut])
    with pytest.raises(CorruptObject) as info:
        list(get_format("tar").records("bad/s.tar", str(obj)))
    assert info.value.key == "bad/s.tar"


# --- compressed input -------------------------------------------------------------------------

RECORDS = [bytes([i]) * (i * 37) for i in range(200)]


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("kind", ["tfrecord", "raw"])
def test_compressed_objects_are_decompressed(tmp_path: Path, suffix: str, kind: str) -> None:
    plain = b"".join(frame(r) for r in RECORDS)
    obj = tmp_path / "obj"
    obj.write_bytes(compress(plain, suffix))
    key = f"d/part.tfrecord{suffix}"
    got = list(get_format(kind).records(key, str(obj)))
    if kind == "tfrecord":
        assert got == RECORDS
    else:
        (example,) = got
        feature = tf.train.Example.FromString(example).features.feature
        assert feature["data"].bytes_list.value == [plain]
        assert feature["key"].bytes_list.value == [key.encode()]


def test_gzip_tfrecord_written_by_tensorflow_is_read(tmp_path: Path) -> None:
    obj = tmp_path / "obj"
    options = tf.io.TFRecordOptions(compression_type="GZIP")
    with tf.io.TFRecordWriter(str(obj), options) as writer:
        for r in RECORDS:
            writer.write(r)
    assert list(get_format("tfrecord").records("a.tfrecord.gz", str(obj))) == RECORDS


def test_multi_frame_zstd_is_read_whole(tmp_path: Path) -> None:
    c = zstandard.ZstdCompressor()
    obj = tmp_path / "obj"
    obj.write_bytes(c.compress(b"one\ntwo\n") + c.compress(b"three\n"))
    records = list(get_format("lines").records("a.txt.zst", str(obj)))
    data = [
        tf.train.Example.FromString(r).features.feature["data"].bytes_list.value[0] for r in records
    ]
    assert data == [b"one", b"two", b"three"]


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage"])
def test_damaged_compressed_object_is_corrupt_naming_the_key(
    tmp_path: Path, suffix: str, damage: str
) -> None:
    data = bytearray(compress(b"".join(b"line %d\n" % i for i in range(5000)), suffix))
    if damage == "truncate":
        del data[len(data) // 2 :]
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
    else:
        data = bytearray(b"this is not compressed at all" * 10)
    obj = tmp_path / "obj"
    obj.write_bytes(bytes(data))
    key = f"logs/day.txt{suffix}"
    with pytest.raises(CorruptObject) as info:
        list(get_format("lines").records(key, str(obj)))
    assert info.value.key == key
    assert "\n" not in str(info.value)


def test_zstd_frame_walk_finds_truncation_anywhere(tmp_path: Path) -> None:
    data = zstandard.ZstdCompressor(write_checksum=True).compress(random.randbytes(300_000))
    path = tmp_path / "obj"
    path.write_bytes(data)
    with path.open("rb") as f:
        assert zstd_problem(f) is None
    for cut in (3, 5, 9, len(data) // 3, len(data) - 1):
        path.write_bytes(data[:cut])
        with path.open("rb") as f:
            assert zstd_problem(f) is not None, f"cut at {cut}"


# --- GZIP shards --------------------------------------------------------------------------------


def test_gzip_shard_is_read_by_tensorflow_with_compression_gzip(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    budget = RamBudget(layout, 64 * 1024**2, 1024**2, lambda: False)
    shard = ShardFile(layout, "e00000-w00-0000000.tfrecord.gz", budget, gzip=True)
    records = [b"", b"a" * 100_000, *RECORDS]
    for r in records:
        shard.write_record(r)
    shard.finish()
    path = shard.publish()
    assert path.stat().st_size == shard.size
    assert shard.size < sum(len(r) for r in records) / 10  # repetitive data compresses
    dataset = tf.data.TFRecordDataset(str(path), compression_type="GZIP")
    assert [r.numpy() for r in dataset] == records


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_decompression_streams_in_bounded_memory(tmp_path: Path, suffix: str) -> None:
    """32 MiB of text compresses to well under 1 MiB; reading it must not hold it whole."""
    line = b"x" * 1023 + b"\n"
    obj = tmp_path / "obj"
    if suffix == ".gz":
        with gzip.open(obj, "wb") as f:
            for _ in range(32):
                f.write(line * 1024)
    else:
        with obj.open("wb") as raw, zstandard.ZstdCompressor().stream_writer(raw) as f:
            for _ in range(32):
                f.write(line * 1024)
    assert obj.stat().st_size < 1024**2
    tracemalloc.start()
    try:
        count = sum(1 for _ in get_format("lines").records(f"big.txt{suffix}", str(obj)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 32 * 1024
    assert peak < 8 * 1024**2, f"peak {peak / 2**20:.1f} MiB for 32 MiB of text"
