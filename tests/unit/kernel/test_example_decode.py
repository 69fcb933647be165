"""``prefetchd.example.parse`` against TensorFlow's own Example parser.

Examples come from both sides: the writer's encoder (what ``raw``, ``lines`` and ``tar``
outputs hold) and TensorFlow's protobuf serializer with every feature kind, several values,
empty lists, negative and extreme int64s and float32 edge cases.
"""

from __future__ import annotations

import math
import random
import struct
from typing import Any

import pytest
import tensorflow as tf

from prefetchd.kernel.example_decode import ExampleError, parse
from prefetchd.kernel.example_encode import encode_example


def tf_features(record: bytes) -> dict[str, list[Any]]:
    """What TensorFlow's protobuf parser reads, as plain lists."""
    out: dict[str, list[Any]] = {}
    for name, feature in tf.train.Example.FromString(record).features.feature.items():
        kind = feature.WhichOneof("kind")
        out[name] = list(getattr(feature, kind).value) if kind else []
    return out


def tf_example(features: dict[str, Any]) -> bytes:
    built = {}
    for name, (kind, values) in features.items():
        if kind == "bytes":
            built[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        elif kind == "float":
            built[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        elif kind == "int64":
            built[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
        else:
            built[name] = tf.train.Feature()
    example = tf.train.Example(features=tf.train.Features(feature=built))
    return bytes(example.SerializeToString())


def same(ours: dict[str, list[Any]], theirs: dict[str, list[Any]]) -> bool:
    """Equal, with floats compared by their float32 bit pattern (NaN included)."""
    if ours.keys() != theirs.keys():
        return False
    for name, values in ours.items():
        other = theirs[name]
        if values and isinstance(values[0], float):
            values = [struct.pack("<f", v) for v in values]
            other = [struct.pack("<f", v) for v in other]
        if values != other:
            return False
    return True


def test_reads_the_writers_examples() -> None:
    record = encode_example({"key": b"a/b.jpg", "line_number": 7, "data": b"\x00\xff" * 300})
    assert parse(record) == {"key": [b"a/b.jpg"], "line_number": [7], "data": [b"\x00\xff" * 300]}
    assert parse(record) == tf_features(record)


def test_every_kind_as_tensorflow_writes_it() -> None:
    record = tf_example(
        {
            "image": ("bytes", [b"", b"\x00", bytes(range(256)) * 40]),
            "label": ("int64", [0, 1, -1, 2**63 - 1, -(2**63), 300]),
            "scores": ("float", [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e-45, 3.4e38]),
            "empty_bytes": ("bytes", []),
            "empty_ints": ("int64", []),
            "nothing": ("none", []),
            "naïve ключ": ("bytes", [b"unicode names"]),
        }
    )
    assert same(parse(record), tf_features(record))


def test_random_examples_match_tensorflow() -> None:
    rng = random.Random(14)
    for _ in range(200):
        features: dict[str, Any] = {}
        for i in range(rng.randrange(0, 6)):
            kind = rng.choice(["bytes", "float", "int64"])
            n = rng.randrange(0, 5)
            if kind == "bytes":
                values: list[Any] = [rng.randbytes(rng.randrange(0, 300)) for _ in range(n)]
            elif kind == "float":
                values = [struct.unpack("<f", rng.randbytes(4))[0] for _ in range(n)]
            else:
                values = [rng.randrange(-(2**63), 2**63) for _ in range(n)]
            features[f"f{i}"] = (kind, values)
        record = tf_example(features)
        assert same(parse(record), tf_features(record)), features


def test_unpacked_repeated_scalars_are_read_too() -> None:
    """proto2 writers may emit int64 and float values one field each instead of packed."""
    int64_list = b"\x08\x05" + b"\x08" + b"\xff" * 9 + b"\x01"  # 5, then -1
    float_list = b"\x0d" + struct.pack("<f", 2.5)
    entry = b"\x0a\x01a" + b"\x12" + bytes([len(int64_list) + 2]) + b"\x1a"
    entry += bytes([len(int64_list)]) + int64_list
    entry2 = b"\x0a\x01b" + b"\x12" + bytes([len(float_list) + 2]) + b"\x12"
    entry2 += bytes([len(float_list)]) + float_list
    features = b"\x0a" + bytes([len(entry)]) + entry + b"\x0a" + bytes([len(entry2)]) + entry2
    record = b"\x0a" + bytes([len(features)]) + features
    assert parse(record) == {"a": [5, -1], "b": [2.5]}
    assert parse(record) == tf_features(record)


@pytest.mark.parametrize(
    "record", [b"\x0a\x05abc", b"\x0a", b"\x0b", b"\x0a\x02\x0a\xff", b"\xff" * 12]
)
def test_garbage_raises_example_error(record: bytes) -> None:
    with pytest.raises(ExampleError):
        parse(record)
