"""Byte sizes as people write them: ``16GiB``, ``512MiB``, ``1.5GB``, ``4096``."""

from __future__ import annotations

import re
from fractions import Fraction

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_size(value: object) -> int:
    """Return ``value`` in bytes; raise ``ValueError`` with the reason if it is not a size."""
    if isinstance(value, bool):
        raise ValueError("expected a size such as 512MiB or 16GiB, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return value
    if isinstance(value, float):
        raise ValueError("write sizes as whole bytes or with a unit, e.g. 1.5GiB")
    if not isinstance(value, str):
        raise ValueError("expected a size such as 512MiB or 16GiB")
    match = _SIZE.match(value)
    if match is None or match.group(2).lower() not in _UNITS:
        raise ValueError("expected a size such as 512MiB, 16GiB, 1GB or plain bytes")
    number, unit = match.groups()
    size = Fraction(number) * _UNITS[unit.lower()]  # exact: float rejected 1.001KB
    if size.denominator != 1:
        raise ValueError("the size is not a whole number of bytes")
    return int(size)


def format_size(n: float) -> str:
    """Render bytes for people: ``1.5 GiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
