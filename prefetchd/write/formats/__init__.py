"""Format plugins: how one downloaded object becomes a sequence of records.

A format is anything with ``records(key, path) -> Iterator[bytes]``; each yielded value is the
payload of one output TFRecord. A format must yield the same records in the same order every
time it reads the same file (crash recovery resumes an object by counting records), and signal
bad input by raising ``CorruptObject`` (or any exception, for user plugins) so that the object
is quarantined and the epoch goes on.

The writer reads objects as batches of ready frames (``frames.Frames``). A built-in format may
make them itself, many records per call into the C kernel: ``frames(key, path)`` gives the same
records as ``records`` in the same order, already framed; ``shuffled_frames(key, path, seed)``
gives all of an object's frames in a seeded order of its own (``tfrecord``: uniform, by
offsets), or None to use the bounded block shuffle (``shuffle.py``). Any other format's
records are framed in batches (``frames.batched``).

Built-in formats read ``.gz`` and ``.zst`` objects decompressed (``compressed.open_object``);
a user plugin gets the path of the object as downloaded and may call ``open_object(key, path)``
itself to get the same decompressed stream.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from random import Random
from typing import Protocol, cast

from prefetchd.config import DEFAULT_MAX_RECORD_SIZE, DEFAULT_PARSE_TIMEOUT
from prefetchd.errors import ConfigError
from prefetchd.write.formats.compressed import open_object
from prefetchd.write.formats.lines import LinesFormat
from prefetchd.write.formats.plugin import PluginFormat
from prefetchd.write.formats.raw import RawFormat
from prefetchd.write.formats.tar import TarFormat
from prefetchd.write.formats.tfrecord import TFRecordFormat
from prefetchd.write.frames import BATCH_BYTES, Frames, batched
from prefetchd.write.shuffle import Holding, shuffled_frames

__all__ = [
    "Format",
    "PluginFormat",
    "check_object",
    "get_format",
    "object_frames",
    "one_record",
    "open_object",
    "read_whole_first",
    "shuffled_object",
    "shuffled_object_frames",
]


class Format(Protocol):
    def records(self, key: str, path: str) -> Iterator[bytes]: ...


def object_frames(fmt: Format, key: str, path: str) -> Iterator[Frames]:
    """The object's records framed, in batches, in the order ``fmt.records`` gives them."""
    method = getattr(fmt, "frames", None)
    if method is not None:
        return cast(Iterator[Frames], method(key, path))
    return batched(fmt.records(key, path))


def check_object(fmt: Format, key: str, path: str) -> Iterator[int]:
    """Read the object through as ``object_frames`` does, raising what it raises, keeping
    nothing; yields how many records each step passed (a caller reports progress between
    steps). A format may check without framing (``check(key, path)``: ``tar`` walks its
    headers only); any other is framed and the frames are dropped."""
    method = getattr(fmt, "check", None)
    if method is not None:
        return cast(Iterator[int], method(key, path))
    return (len(frames) for frames in object_frames(fmt, key, path))


def read_whole_first(fmt: Format, key: str, path: str) -> bool:
    """Whether ``fmt`` reads or checks all of the object before it gives its first record
    (``raw``: one record; an uncompressed ``tfrecord`` object of one batch), so a bad object
    fails before any record is taken; other objects are read through once first (the
    writer's ``ObjectReader._validate``)."""
    method = getattr(fmt, "read_whole_first", None)
    return bool(method(key, path)) if method is not None else False


def one_record(fmt: Format) -> bool:
    """Whether ``fmt`` gives exactly one record per object (``raw``): its order is the same
    under every seed, so the writer reads it as ``object_frames`` and draws no seed for it
    (a generator seeded per object, ~3 us of a small object's ~0.3 ms)."""
    return getattr(fmt, "one_record", False) is True


def shuffled_object_frames(
    fmt: Format,
    key: str,
    path: str,
    seed: int,
    *,
    max_records: int,
    max_bytes: int,
    holding: Holding | None = None,
) -> Iterator[Frames]:
    """The object's frames in a seeded random order (same file and ``seed`` -> same order):
    the format's own whole-object order if it has one, else the bounded block shuffle (which
    reports what it keeps between batches in ``holding``)."""
    method = getattr(fmt, "shuffled_frames", None)
    whole = method(key, path, seed) if method is not None else None
    if whole is not None:
        return cast(Iterator[Frames], whole)
    bounds = {"max_records": max_records, "max_bytes": max_bytes}
    return shuffled_frames(object_frames(fmt, key, path), seed, **bounds, holding=holding)


def shuffled_object(
    fmt: Format, key: str, path: str, rng: Random, *, max_records: int, max_bytes: int
) -> Iterator[bytes]:
    """The records of ``shuffled_object_frames`` seeded by 64 bits of ``rng``: the order the
    writer writes them in."""
    seed = rng.getrandbits(64)
    bounds = {"max_records": max_records, "max_bytes": max_bytes}
    for frames in shuffled_object_frames(fmt, key, path, seed, **bounds, holding=None):
        yield from frames.payloads()


_BUILTIN: dict[str, Callable[[int], Format]] = {
    "tfrecord": TFRecordFormat,
    "raw": RawFormat,
    "lines": LinesFormat,
    "tar": TarFormat,
}


def get_format(
    spec: str,
    *,
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
    parse_timeout: float = DEFAULT_PARSE_TIMEOUT,
    batch_bytes: int = BATCH_BYTES,
) -> Format:
    """The format named by ``source.format``, refusing records over ``max_record_size`` and
    (a plugin) giving up on an object after ``parse_timeout`` seconds; raises
    ``ConfigError`` if a plugin won't import. ``tfrecord`` reads uncompressed objects
    ``batch_bytes`` at a time (the writer makes it smaller when many objects are open)."""
    if spec in _BUILTIN:
        if spec == "tfrecord":
            return TFRecordFormat(max_record_size, batch_bytes)
        return _BUILTIN[spec](max_record_size)
    module_name, _, function_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(
            f"source.format: cannot import {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ConfigError(f"source.format: {module_name!r} has no function {function_name!r}")
    return PluginFormat(spec, function, max_record_size, parse_timeout)
