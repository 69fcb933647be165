"""Format plugins: how one downloaded object becomes a sequence of records.

A format is anything with ``records(key, path) -> Iterator[bytes]``; each yielded value is the
payload of one output TFRecord. A format must yield the same records in the same order every
time it reads the same file (crash recovery resumes an object by counting records), and signal
bad input by raising ``CorruptObject`` (or any exception, for user plugins) so that the object
is quarantined and the epoch goes on.

Built-in formats read ``.gz`` and ``.zst`` objects decompressed (``compressed.open_object``);
a user plugin gets the path of the object as downloaded and may call ``open_object(key, path)``
itself to get the same decompressed stream.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from random import Random
from typing import Protocol, cast

from prefetchd.errors import ConfigError, CorruptObject
from prefetchd.write.formats.compressed import open_object
from prefetchd.write.formats.lines import LinesFormat
from prefetchd.write.formats.raw import RawFormat
from prefetchd.write.formats.tar import TarFormat
from prefetchd.write.formats.tfrecord import TFRecordFormat
from prefetchd.write.shuffle import shuffled_records

__all__ = ["Format", "PluginFormat", "get_format", "open_object", "shuffled_object"]


class Format(Protocol):
    def records(self, key: str, path: str) -> Iterator[bytes]: ...


def shuffled_object(
    fmt: Format, key: str, path: str, rng: Random, *, max_records: int, max_bytes: int
) -> Iterator[bytes]:
    """The object's records in a seeded random order (same file and ``rng`` -> same order).

    A format with a ``shuffled(key, path, rng)`` method that returns an iterator shuffles the
    whole object itself (``tfrecord`` by offsets, 8 bytes per record); any other object goes
    through a bounded shuffle buffer (``shuffle.shuffled_records``).
    """
    method = getattr(fmt, "shuffled", None)
    whole = method(key, path, rng) if method is not None else None
    if whole is not None:
        return cast(Iterator[bytes], whole)
    return shuffled_records(
        fmt.records(key, path), rng, max_records=max_records, max_bytes=max_bytes
    )


class PluginFormat:
    """``"package.module:function"``: user code ``function(key, path) -> Iterable[bytes]``."""

    def __init__(self, spec: str, function: Callable[[str, str], Iterable[bytes]]) -> None:
        self.spec = spec
        self.function = function

    def records(self, key: str, path: str) -> Iterator[bytes]:
        try:
            for record in self.function(key, path):
                if not isinstance(record, bytes | bytearray | memoryview):
                    raise TypeError(f"yielded {type(record).__name__}, expected bytes")
                yield bytes(record)
        except CorruptObject:
            raise
        except Exception as exc:  # user code: any failure quarantines this object only
            raise CorruptObject(key, f"{self.spec} raised {type(exc).__name__}: {exc}") from exc


_BUILTIN: dict[str, Callable[[], Format]] = {
    "tfrecord": TFRecordFormat,
    "raw": RawFormat,
    "lines": LinesFormat,
    "tar": TarFormat,
}


def get_format(spec: str) -> Format:
    """The format named by ``source.format``; raises ``ConfigError`` if a plugin won't import."""
    if spec in _BUILTIN:
        return _BUILTIN[spec]()
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
    return PluginFormat(spec, function)
