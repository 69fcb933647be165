"""What every message between prefetchd's processes shares: the rule for other versions.

The processes of one host may run different versions of prefetchd: a spawned child imports the
package from disk, which an upgrade may have replaced under a running supervisor, and a trainer
(its own container, its own install) reads the status of a daemon of another release. So every
message (status record, child report, consumer report, keep figures, writer journal line) is
read by one rule: a field the reader does not know is ignored; a field that is missing, or holds
a JSON type the reader cannot use, takes the field's default. Each message keeps a format
``version`` that goes up only when a field changes meaning, never for a new field; a message
whose meaning cannot be guessed (the writer journal) refuses a newer version instead.

Every message has one codec shape: a frozen dataclass with ``VERSION`` (the format version
this release writes), ``encode() -> bytes`` and the classmethod ``decode(bytes)``, which
raises ``MessageError`` (a ``ValueError``) for bytes that hold no such message and otherwise
never fails on their contents; a message that nests in another one, or that its reader finds
already parsed, also has ``decode_object`` for the JSON value. ``json_object`` and
``scalar_fields`` apply the rule for a decoder. (A leaf module: standard library only.)
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

_UNUSABLE = object()


class MessageError(ValueError):
    """Bytes that hold no message of the kind asked for (empty, torn, not JSON, not one)."""


def json_object(data: bytes) -> dict[str, Any]:
    """The JSON object ``data`` holds (UTF-8, surrounding spaces, NULs and newlines ignored);
    ``MessageError`` if it holds none."""
    try:
        raw: Any = json.loads(data.decode("utf-8").strip(" \0\n"))
    except ValueError:
        raise MessageError("not a JSON text") from None
    if not isinstance(raw, dict):
        raise MessageError("not a JSON object")
    return raw


def _int(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _UNUSABLE
    return int(value)


def _float(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return _UNUSABLE
    return float(value)


def _bool(value: Any) -> Any:
    return value if isinstance(value, bool) else _UNUSABLE


def _str(value: Any) -> Any:
    return value if isinstance(value, str) else _UNUSABLE


def _optional(read: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else read(value)


# Keyed by the annotation as written: every message module uses ``from __future__ import
# annotations``, so a dataclass field's ``type`` is this string.
_READERS: dict[str, Callable[[Any], Any]] = {
    "int": _int,
    "float": _float,
    "bool": _bool,
    "str": _str,
    "int | None": _optional(_int),
    "float | None": _optional(_float),
    "str | None": _optional(_str),
}


def scalar_fields(cls: type[Any], raw: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for dataclass ``cls`` from the JSON object ``raw``.

    Covers the fields annotated ``int``, ``float``, ``bool``, ``str`` or one of them ``| None``;
    a value of another JSON type is left out, as is a missing one, so the field keeps its
    default. Other fields (nested messages) are for the caller. Never raises on ``raw``'s
    contents.
    """
    kwargs: dict[str, Any] = {}
    for field in fields(cls):
        read = _READERS.get(str(field.type))
        if read is None or field.name not in raw:
            continue
        value = read(raw[field.name])
        if value is not _UNUSABLE:
            kwargs[field.name] = value
    return kwargs


def field_names(cls: type[Any]) -> frozenset[str]:
    """The names of dataclass ``cls``'s fields."""
    return frozenset(f.name for f in fields(cls))
