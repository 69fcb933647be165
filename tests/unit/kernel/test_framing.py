"""TFRecord framing done without TensorFlow, checked against real TensorFlow both ways."""

from __future__ import annotations

import gzip
import io
import random
import struct
from pathlib import Path

import pytest
import tensorflow as tf

from prefetchd.kernel.framing import (
    FRAME_OVERHEAD,
    FramingError,
    frame,
    frame_header,
    masked_crc,
    read_records,
)

MiB = 1024 * 1024
_rng = random.Random(20240601)
RECORDS = [
    b"",
    b"a",
    b"\x00" * 7,
    bytes(range(256)),
    _rng.randbytes(1000),
    b"",
    _rng.randbytes(MiB + 12345),  # larger than 1 MiB
    b"last",
]


def tf_read(path: Path, compression: str = "") -> list[bytes]:
    dataset = tf.data.TFRecordDataset(str(path), compression_type=compression)
    return [bytes(r) for r in dataset.as_numpy_iterator()]


def our_read(path: Path) -> list[bytes]:
    with open(path, "rb") as f:
        return list(read_records(f))


def write_frames(path: Path, records: list[bytes]) -> Path:
    path.write_bytes(b"".join(frame(r) for r in records))
    return path


def test_masked_crc_known_values() -> None:
    assert masked_crc(b"") == 0xA282EAD8  # CRC32C("") is 0, so only the mask delta remains
    crc = 0xE3069283  # CRC32C("123456789"), the standard check value
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
    assert masked_crc(memoryview(b"123456789")) == masked_crc(b"123456789")


def test_frame_layout() -> None:
    data = b"payload"
    framed = frame(data)
    assert len(framed) == len(data) + FRAME_OVERHEAD
    assert framed.startswith(frame_header(len(data)))
    assert struct.unpack("<Q", framed[:8]) == (len(data),)
    assert framed[12:-4] == data


def test_tensorflow_reads_what_we_frame(tmp_path: Path) -> None:
    path = write_frames(tmp_path / "ours.tfrecord", RECORDS)
    assert tf_read(path) == RECORDS


def test_tensorflow_reads_our_frames_gzipped(tmp_path: Path) -> None:
    path = tmp_path / "ours.tfrecord.gz"
    path.write_bytes(gzip.compress(b"".join(frame(r) for r in RECORDS)))
    assert tf_read(path, "GZIP") == RECORDS


def test_we_read_what_tensorflow_writes_byte_identically(tmp_path: Path) -> None:
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in RECORDS:
            writer.write(record)
    assert our_read(path) == RECORDS
    # the framing itself is identical, so shards are indistinguishable from TF's own
    assert path.read_bytes() == b"".join(frame(r) for r in RECORDS)


def test_empty_file_has_no_records(tmp_path: Path) -> None:
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    assert our_read(path) == []
    assert tf_read(path) == []


def corrupt_positions() -> list[tuple[str, int]]:
    """(what, byte index relative to the start of the second frame)."""
    n = len(b"second record")
    return [
        ("length", 0),
        ("length", 7),
        ("length-crc", 8),
        ("length-crc", 11),
        ("data", 12),
        ("data", 12 + n - 1),
        ("data-crc", 12 + n),
        ("data-crc", 12 + n + 3),
    ]


@pytest.mark.parametrize(("what", "index"), corrupt_positions())
def test_flipped_byte_is_a_framing_error_at_the_frame(
    tmp_path: Path, what: str, index: int
) -> None:
    first = frame(b"first record")
    good = first + frame(b"second record") + frame(b"third")
    damaged = bytearray(good)
    damaged[len(first) + index] ^= 0x10
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bytes(damaged))

    seen: list[bytes] = []
    with pytest.raises(FramingError) as info, open(path, "rb") as f:
        seen.extend(read_records(f))
    assert seen == [b"first record"], "records before the damage are still delivered"
    assert info.value.offset == len(first)
    assert f"at byte {len(first)}" in str(info.value)
    assert "CRC" in str(info.value)

    with pytest.raises(tf.errors.DataLossError):
        tf_read(path)


@pytest.mark.parametrize("keep", [1, 11, 12, 20, -4, -1])
def test_truncated_file_is_a_framing_error_with_the_offset(tmp_path: Path, keep: int) -> None:
    first, second = frame(b"first record"), frame(b"second record")
    cut = len(first) + (keep if keep > 0 else len(second) + keep)
    path = tmp_path / "short.tfrecord"
    path.write_bytes((first + second)[:cut])
    with pytest.raises(FramingError) as info:
        our_read(path)
    assert info.value.offset == len(first)
    assert "truncated" in str(info.value)


def test_offsets_count_from_start_offset_when_resuming() -> None:
    first = frame(b"one")
    stream = io.BytesIO(first + frame(b"two")[:-1])
    stream.seek(len(first))
    with pytest.raises(FramingError) as info:
        list(read_records(stream, start_offset=len(first)))
    assert info.value.offset == len(first)


def test_a_file_that_is_not_a_tfrecord(tmp_path: Path) -> None:
    path = tmp_path / "text.tfrecord"
    path.write_bytes(b"this is just some text, not a TFRecord file\n" * 3)
    with pytest.raises(FramingError) as info:
        our_read(path)
    assert info.value.offset == 0
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("length", [2**40, 2**62, 2**64 - 1])
def test_corrupt_but_crc_valid_length_is_truncation_not_a_crash(
    tmp_path: Path, length: int
) -> None:
    # regression: a length that passes its CRC used to reach read(length) and raise
    # MemoryError/OverflowError instead of FramingError, killing the writer
    path = tmp_path / "huge.tfrecord"
    path.write_bytes(frame(b"ok") + frame_header(length) + b"only a few bytes")
    with pytest.raises(FramingError) as info:
        our_read(path)
    assert info.value.offset == len(frame(b"ok"))
    assert "truncated" in str(info.value)


def test_framing_error_is_a_value_error() -> None:
    err = FramingError(42, "data CRC mismatch")
    assert isinstance(err, ValueError)
    assert (err.offset, err.reason) == (42, "data CRC mismatch")
