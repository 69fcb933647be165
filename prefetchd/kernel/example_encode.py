"""``tf.train.Example`` protobuf encoding without protobuf or TensorFlow.

Only what the formats need: features whose values are one bytes string or one int64. The
wire layout (proto3)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }     # each entry: key = 1, value = 2
    Feature   { oneof { BytesList bytes_list = 1; FloatList = 2; Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    Int64List { repeated int64 value = 1 [packed = true]; }
"""

from __future__ import annotations

from collections.abc import Mapping

FeatureValue = bytes | int


def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 is encoded as its two's complement, always 10 bytes
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: FeatureValue) -> bytes:
    if isinstance(value, bool):
        raise TypeError("bool is not a feature value; use int")
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 63):
            raise ValueError(f"int64 feature out of range: {value}")
        return _field(3, _field(1, _varint(value)))
    if isinstance(value, bytes | bytearray | memoryview):
        return _field(1, _field(1, bytes(value)))
    raise TypeError(f"unsupported feature value type {type(value).__name__}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a tf.train.Example; entries are written in sorted key order (deterministic).
    A name holding surrogate escapes is written as the bytes they stand for."""
    entries = b"".join(
        _field(1, _field(1, _name(name)) + _field(2, _feature(features[name])))
        for name in sorted(features)
    )
    return _field(1, entries)


def sorted_features(features: Mapping[str, FeatureValue]) -> list[tuple[bytes, FeatureValue]]:
    """``features`` as the C kernel's ``frame_examples`` takes them: ``(UTF-8 name, value)`` in
    the order ``encode_example`` writes them (UTF-8 byte order is code point order)."""
    return [(_name(name), features[name]) for name in sorted(features)]


def _name(name: str) -> bytes:
    """A feature name's bytes: UTF-8, and a name decoded from bytes that are not UTF-8 (a
    tar member's extension, decoded with ``surrogateescape``) as those original bytes."""
    return name.encode("utf-8", "surrogateescape")
