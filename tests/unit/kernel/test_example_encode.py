"""tf.train.Example encoding without TensorFlow, checked against TensorFlow's protobuf."""

from __future__ import annotations

import pytest
import tensorflow as tf

from prefetchd.kernel.example_encode import FeatureValue, encode_example

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def tf_example(features: dict[str, FeatureValue]) -> tf.train.Example:
    built = {}
    for name in sorted(features):
        value = features[name]
        if isinstance(value, int):
            built[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
        else:
            built[name] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Example(features=tf.train.Features(feature=built))


CASES: list[dict[str, FeatureValue]] = [
    {},
    {"key": b"train/000001.jpg", "data": b"\xff\xd8\xff" + bytes(range(256)) * 4},
    {"empty": b"", "zero": 0},
    {"one": 1, "minus_one": -1, "max": INT64_MAX, "min": INT64_MIN, "big": 2**40 + 3},
    {"größe": 7, "日本語": b"\xe6\x97\xa5", "emoji 🙂": b"x", "": b"empty name"},
    {"b": 2, "a": 1, "B": 3, "_": 4, "a_b": b"z"},  # not given in sorted order
    {"label": -(2**31), "ünïcödé": INT64_MAX, "Ω": INT64_MIN, "z": b"\x00"},
    {"data": b"\x00" * 200_000},  # length needs a multi-byte varint
]


def prefix_free(features: dict[str, FeatureValue]) -> bool:
    names = [n.encode() for n in features]
    return not any(a != b and b.startswith(a) for a in names for b in names)


@pytest.mark.parametrize("features", CASES)
def test_tensorflow_parses_our_example(features: dict[str, FeatureValue]) -> None:
    parsed = tf.train.Example.FromString(encode_example(features))
    assert parsed == tf_example(features)
    feature_map = parsed.features.feature
    assert set(feature_map) == set(features)
    for name, value in features.items():
        feature = feature_map[name]
        if isinstance(value, int):
            assert feature.WhichOneof("kind") == "int64_list"
            assert list(feature.int64_list.value) == [value]
        else:
            assert feature.WhichOneof("kind") == "bytes_list"
            assert list(feature.bytes_list.value) == [value]


@pytest.mark.parametrize("features", [c for c in CASES if prefix_free(c)])
def test_byte_identical_to_tensorflow_serialization(features: dict[str, FeatureValue]) -> None:
    # deterministic=True is protobuf's sorted-map-keys order (plain SerializeToString() writes
    # map entries in hash order, which varies between processes). Key sets where one name is a
    # prefix of another are left out: Python's upb runtime sorts those wrongly (see
    # protocolbuffers/protobuf#26621), C++ protobuf and we sort them bytewise.
    expected = tf_example(features).SerializeToString(deterministic=True)
    assert encode_example(features) == expected


@pytest.mark.parametrize("features", CASES)
def test_entries_are_in_bytewise_key_order(features: dict[str, FeatureValue]) -> None:
    encoded = encode_example(features)
    names = sorted((n.encode() for n in features), key=bytes)
    key_fields = [b"\n" + bytes([len(n)]) + n for n in names if len(n) < 128]
    positions = [encoded.index(field) for field in key_fields]
    assert positions == sorted(positions)


def test_encoding_is_deterministic_whatever_the_insertion_order() -> None:
    a: dict[str, FeatureValue] = {"key": b"k", "data": b"d", "label": 3}
    b: dict[str, FeatureValue] = {"label": 3, "data": b"d", "key": b"k"}
    assert encode_example(a) == encode_example(b)


def test_parse_single_example_reads_key_data_and_ints() -> None:
    serialized = encode_example(
        {"key": "dir/ä.bin".encode(), "data": b"\x00\x01raw", "label": -5, "id": INT64_MAX}
    )
    spec = {
        "key": tf.io.FixedLenFeature([], tf.string),
        "data": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "id": tf.io.FixedLenFeature([], tf.int64),
    }
    parsed = tf.io.parse_single_example(serialized, spec)
    assert parsed["key"].numpy() == "dir/ä.bin".encode()
    assert parsed["data"].numpy() == b"\x00\x01raw"
    assert parsed["label"].numpy() == -5
    assert parsed["id"].numpy() == INT64_MAX


def test_bytes_like_values_are_accepted() -> None:
    expected = encode_example({"data": b"abc"})
    # the formats pass file contents along as they come; bytes-likes work at runtime
    assert encode_example({"data": bytearray(b"abc")}) == expected  # type: ignore[dict-item]
    assert encode_example({"data": memoryview(b"abc")}) == expected  # type: ignore[dict-item]


@pytest.mark.parametrize("value", [INT64_MAX + 1, INT64_MIN - 1, 2**64])
def test_int_outside_int64_is_rejected(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        encode_example({"n": value})


@pytest.mark.parametrize("value", [True, 1.5, "text", None, [1, 2]])
def test_unsupported_values_are_rejected(value: object) -> None:
    with pytest.raises(TypeError):
        encode_example({"v": value})  # type: ignore[dict-item]
