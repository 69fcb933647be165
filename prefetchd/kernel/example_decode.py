"""Decode a serialized ``tf.train.Example`` without TensorFlow or protobuf.

``parse(record)`` turns the records of ``raw``, ``lines`` and ``tar`` outputs (and any other
Example) into ``{name: [values]}`` for PyTorch, JAX or plain Python::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }     # each entry: key = 1, value = 2
    Feature   { oneof { BytesList = 1; FloatList = 2; Int64List = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed]; }    # packed or not: both are accepted
    Int64List { repeated int64 value = 1 [packed]; }

It follows protobuf's rules as TensorFlow's parser does: unknown fields are skipped, a later
entry for the same feature name replaces an earlier one, a feature with no list is an empty
list, and in a oneof the last list present wins.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

FeatureList = list[bytes] | list[float] | list[int]

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5
_BYTES_LIST, _FLOAT_LIST, _INT64_LIST = 1, 2, 3


class ExampleError(ValueError):
    """The bytes are not a valid serialized ``tf.train.Example``."""


def parse(record: bytes) -> dict[str, FeatureList]:
    """The features of a serialized Example: bytes features as ``list[bytes]``, float features
    as ``list[float]`` (float32 values), int64 features as ``list[int]``.

    Raises ``ExampleError`` if ``record`` is not a well-formed Example.
    """
    view = memoryview(record)
    out: dict[str, FeatureList] = {}
    try:
        for number, wire, value in _fields(view):
            if number == 1 and wire == _BYTES:
                assert isinstance(value, memoryview)
                _parse_features(value, out)
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise ExampleError(f"not a tf.train.Example: {exc}") from None
    return out


def _parse_features(features: memoryview, out: dict[str, FeatureList]) -> None:
    for number, wire, entry in _fields(features):
        if number != 1 or wire != _BYTES:
            continue
        assert isinstance(entry, memoryview)
        name, value = "", memoryview(b"")
        for field, kind, part in _fields(entry):
            if kind != _BYTES:
                continue
            assert isinstance(part, memoryview)
            if field == 1:
                name = str(part, "utf-8")
            elif field == 2:
                value = part
        out[name] = _feature(value)


def _feature(feature: memoryview) -> FeatureList:
    """The values of the last list in a ``Feature`` (its oneof), ``[]`` if it has none."""
    values: FeatureList = []
    for number, wire, body in _fields(feature):
        if wire != _BYTES:
            continue
        assert isinstance(body, memoryview)
        if number == _BYTES_LIST:
            values = _bytes(body)
        elif number == _FLOAT_LIST:
            values = _floats(body)
        elif number == _INT64_LIST:
            values = _ints(body)
    return values


def _bytes(body: memoryview) -> list[bytes]:
    return [bytes(v) for n, _, v in _fields(body) if n == 1 and isinstance(v, memoryview)]


def _floats(body: memoryview) -> list[float]:
    out: list[float] = []
    for number, wire, value in _fields(body):
        if number != 1:
            continue
        if wire == _BYTES:  # packed
            assert isinstance(value, memoryview)
            out.extend(v for (v,) in struct.iter_unpack("<f", value))
        elif wire == _FIXED32:
            assert isinstance(value, memoryview)
            out.append(struct.unpack("<f", value)[0])
    return out


def _ints(body: memoryview) -> list[int]:
    out: list[int] = []
    for number, wire, value in _fields(body):
        if number != 1:
            continue
        if wire == _BYTES:  # packed
            assert isinstance(value, memoryview)
            pos = 0
            while pos < len(value):
                n, pos = _varint(value, pos)
                out.append(_int64(n))
        elif wire == _VARINT:
            assert isinstance(value, int)
            out.append(_int64(value))
    return out


def _int64(n: int) -> int:
    """A varint as int64 (negative numbers are their 64-bit two's complement)."""
    n &= (1 << 64) - 1
    return n - (1 << 64) if n >= 1 << 63 else n


def _varint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise ExampleError("varint longer than 10 bytes")


def _fields(buf: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """``(field number, wire type, value)`` of each field of a message: an int for varints,
    the raw bytes for the others."""
    pos, end = 0, len(buf)
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == _VARINT:
            value, pos = _varint(buf, pos)
            yield number, wire, value
            continue
        if wire == _BYTES:
            size, pos = _varint(buf, pos)
        elif wire in (_FIXED64, _FIXED32):
            size = 8 if wire == _FIXED64 else 4
        else:
            raise ExampleError(f"unsupported protobuf wire type {wire}")
        if pos + size > end:
            raise ExampleError("field runs past the end of its message")
        yield number, wire, buf[pos : pos + size]
        pos += size
