"""Formats turn one downloaded object into records; bad input becomes CorruptObject."""

from __future__ import annotations

import gzip
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tensorflow as tf

from prefetchd.errors import EXIT_USAGE, ConfigError, CorruptObject
from prefetchd.kernel import choice
from prefetchd.kernel.framing import frame
from prefetchd.write.formats import get_format
from prefetchd.write.formats.raw import RawFormat

KEY = "data/train/part-00001.tfrecord"
RECORDS = [b"first", b"", b"\x00\xff" * 5000, b"last"]


def write_tf(path: Path, records: list[bytes]) -> Path:
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return path


def one_line(err: BaseException) -> str:
    message = str(err)
    assert message and "\n" not in message, repr(message)
    return message


# --- tfrecord ---------------------------------------------------------------------------------


def test_tfrecord_format_passes_every_record_through(tmp_path: Path) -> None:
    path = write_tf(tmp_path / "obj", RECORDS)
    fmt = get_format("tfrecord")
    assert list(fmt.records(KEY, str(path))) == RECORDS
    # the same file gives the same records in the same order (recovery counts on it)
    assert list(fmt.records(KEY, str(path))) == RECORDS


def test_tfrecord_format_empty_object_has_no_records(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(b"")
    assert list(get_format("tfrecord").records(KEY, str(path))) == []


@pytest.mark.parametrize("damage", ["flip-data", "flip-length", "truncate", "not-tfrecord"])
def test_tfrecord_format_corrupt_object_names_the_key(tmp_path: Path, damage: str) -> None:
    first = frame(b"first")
    good = bytearray(first + frame(b"second record") + frame(b"third"))
    if damage == "flip-data":
        good[len(first) + 14] ^= 0xFF
    elif damage == "flip-length":
        good[len(first)] ^= 0x01
    elif damage == "truncate":
        del good[-3:]
    else:
        good = bytearray(b"PK\x03\x04 this is a zip file, not a TFRecord" * 4)
    path = tmp_path / "obj"
    path.write_bytes(bytes(good))
    key = "../../etc/passwd"

    with pytest.raises(CorruptObject) as info:
        list(get_format("tfrecord").records(key, str(path)))
    message = one_line(info.value)
    assert info.value.key == key
    assert message.startswith(key + ": ")
    assert "byte" in message, "the offset of the bad frame is reported"


# --- raw --------------------------------------------------------------------------------------

RAW_SPEC = {
    "key": tf.io.FixedLenFeature([], tf.string),
    "data": tf.io.FixedLenFeature([], tf.string),
}


@pytest.mark.parametrize(
    ("key", "key_bytes"),
    [
        ("images/cat.jpg", b"images/cat.jpg"),
        ("ü/日本語.bin", "ü/日本語.bin".encode()),
        ("../../etc/passwd", b"../../etc/passwd"),
        ("raw\udcffbyte", b"raw\xffbyte"),  # a key that was not UTF-8 keeps its bytes
    ],
)
def test_raw_format_yields_one_example_with_key_and_data(
    tmp_path: Path, key: str, key_bytes: bytes
) -> None:
    data = bytes(range(256)) * 100
    path = tmp_path / "obj"
    path.write_bytes(data)
    records = list(get_format("raw").records(key, str(path)))
    assert len(records) == 1
    parsed = tf.io.parse_single_example(records[0], RAW_SPEC)
    assert parsed["key"].numpy() == key_bytes
    assert parsed["data"].numpy() == data


def test_raw_format_empty_object_is_one_example(tmp_path: Path) -> None:
    path = tmp_path / "obj"
    path.write_bytes(b"")
    (record,) = get_format("raw").records("empty", str(path))
    example = tf.train.Example.FromString(record)
    assert example.features.feature["data"].bytes_list.value == [b""]


def read_raw_shard(shard: Path, frames: list[bytes]) -> dict[str, bytes]:
    """``frames`` written as one shard and read back by TensorFlow: key -> data."""
    shard.write_bytes(b"".join(frames))
    dataset = tf.data.TFRecordDataset(str(shard)).map(
        lambda r: tf.io.parse_single_example(r, RAW_SPEC)
    )
    return {bytes(x["key"]).decode(): bytes(x["data"]) for x in dataset.as_numpy_iterator()}


def test_raw_records_are_readable_through_a_tfrecord_file(tmp_path: Path) -> None:
    objects = {f"k{i}": bytes([i]) * (i * 1000) for i in range(5)}
    frames = []
    for key, data in objects.items():
        (tmp_path / key).write_bytes(data)
        frames += [frame(r) for r in get_format("raw").records(key, str(tmp_path / key))]
    assert read_raw_shard(tmp_path / "shard.tfrecord", frames) == objects


@pytest.mark.parametrize("fast", [True, False], ids=["read-into-frame", "size-changed"])
def test_raw_frames_are_the_records_framed_and_tensorflow_reads_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast: bool
) -> None:
    """What the writer takes (``frames``: an uncompressed object read straight into its frame)
    is ``records`` framed, byte for byte; and when the object changed size while it was read,
    it is read again the general way."""
    if not fast:
        monkeypatch.setattr(choice.KERNEL, "frame_file_example", lambda *_: None)
    raw = get_format("raw")
    assert isinstance(raw, RawFormat)
    objects = {f"k{i}/ü": bytes([i]) * size for i, size in enumerate([0, 1, 127, 70_000, 200_000])}
    written: list[bytes] = []
    for key, data in objects.items():
        path = tmp_path / f"obj{len(written)}"
        path.write_bytes(data)
        (batch,) = raw.frames(key, str(path))
        (record,) = raw.records(key, str(path))
        assert batch.data == frame(record)
        lane = raw.one_frame(key, str(path))  # the writer's lane for one-record objects
        assert (lane.data, list(lane.ends)) == (batch.data, list(batch.ends))
        written.append(batch.data)
    assert read_raw_shard(tmp_path / "shard.tfrecord", written) == objects


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_a_compressed_raw_objects_lane_frame_is_its_record_framed(
    tmp_path: Path, suffix: str
) -> None:
    """The lane (``one_frame``) of a compressed raw object reads it decompressed, as
    ``records`` does: the same frame byte for byte."""
    data = bytes(range(256)) * 300
    path = tmp_path / "obj"
    if suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        zstd = pytest.importorskip("zstandard")
        path.write_bytes(zstd.ZstdCompressor().compress(data))
    raw = get_format("raw")
    assert isinstance(raw, RawFormat)
    key = f"dir/sample.bin{suffix}"
    (record,) = raw.records(key, str(path))
    lane = raw.one_frame(key, str(path))
    assert lane.data == frame(record) and list(lane.ends) == [len(lane.data)]
    assert read_raw_shard(tmp_path / "shard.tfrecord", [lane.data]) == {key: data}


# --- plugins ----------------------------------------------------------------------------------


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a plugin package into tmp_path; returns its ``package.module`` name."""
    package = f"pfd_test_plugin_{uuid.uuid4().hex[:12]}"

    def make(source: str) -> str:
        root = tmp_path / "plugins" / package
        root.mkdir(parents=True)
        (root / "__init__.py").write_text("")
        (root / "fmt.py").write_text(textwrap.dedent(source))
        return f"{package}.fmt"

    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    yield make
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]


def test_plugin_records_are_what_the_function_yields(
    plugin: Callable[[str], str], tmp_path: Path
) -> None:
    module = plugin(
        """
        def records(key, path):
            with open(path, "rb") as f:
                for line in f:
                    yield line.rstrip(b"\\n")
            yield bytearray(key.encode())
            yield memoryview(b"end")
        """
    )
    path = tmp_path / "obj.txt"
    path.write_bytes(b"one\ntwo\n")
    fmt = get_format(f"{module}:records")
    records = list(fmt.records("my/key", str(path)))
    assert records == [b"one", b"two", b"my/key", b"end"]
    assert all(type(r) is bytes for r in records)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ('yield b"ok"\n    raise ValueError("bad header in " + key)', ["ValueError", "bad header"]),
        ('raise OSError("disk said no")\n    yield b""', ["OSError", "disk said no"]),
        ('yield "a str, not bytes"', ["str", "bytes"]),
        ("yield 42", ["int", "bytes"]),
        ("return 7", ["TypeError"]),  # not iterable
    ],
    ids=["raises-midway", "raises-first", "yields-str", "yields-int", "not-iterable"],
)
def test_plugin_exceptions_become_corrupt_object(
    plugin: Callable[[str], str], tmp_path: Path, body: str, names: list[str]
) -> None:
    module = plugin(f"def records(key, path):\n    {body}\n")
    spec = f"{module}:records"
    (tmp_path / "obj").write_bytes(b"")
    with pytest.raises(CorruptObject) as info:
        list(get_format(spec).records("bad/key.bin", str(tmp_path / "obj")))
    message = one_line(info.value)
    assert info.value.key == "bad/key.bin"
    assert message.startswith("bad/key.bin: ")
    assert spec in message
    for name in names:
        assert name in message


def test_plugin_raising_corrupt_object_is_passed_through(
    plugin: Callable[[str], str], tmp_path: Path
) -> None:
    module = plugin(
        """
        from prefetchd.errors import CorruptObject

        def records(key, path):
            raise CorruptObject(key, "checksum in trailer does not match")
            yield b""
        """
    )
    (tmp_path / "obj").write_bytes(b"")
    with pytest.raises(CorruptObject) as info:
        list(get_format(f"{module}:records").records("k", str(tmp_path / "obj")))
    assert info.value.reason == "checksum in trailer does not match"


def test_missing_plugin_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        get_format("no_such_pkg_for_prefetchd_tests.fmt:records")
    message = one_line(info.value)
    assert info.value.exit_code == EXIT_USAGE
    assert "source.format" in message
    assert "no_such_pkg_for_prefetchd_tests.fmt" in message


@pytest.mark.parametrize(
    ("source", "names"),
    [
        ("import no_such_dependency_for_prefetchd_tests\n", ["ModuleNotFoundError"]),
        ('raise RuntimeError("plugin needs CONFIG_X")\n', ["RuntimeError", "CONFIG_X"]),
        ("def records(key, path:\n", ["SyntaxError"]),
    ],
    ids=["missing-dependency", "raises-on-import", "syntax-error"],
)
def test_plugin_that_fails_to_import_is_a_config_error(
    plugin: Callable[[str], str], source: str, names: list[str]
) -> None:
    module = plugin(source)
    with pytest.raises(ConfigError) as info:
        get_format(f"{module}:records")
    message = one_line(info.value)
    assert "source.format" in message
    assert module in message
    for name in names:
        assert name in message


@pytest.mark.parametrize(
    "source", ["def other(key, path):\n    yield b''\n", "records = 'not a function'\n"]
)
def test_plugin_without_the_function_is_a_config_error(
    plugin: Callable[[str], str], source: str
) -> None:
    module = plugin(source)
    with pytest.raises(ConfigError) as info:
        get_format(f"{module}:records")
    message = one_line(info.value)
    assert "source.format" in message
    assert "'records'" in message
    assert module in message
