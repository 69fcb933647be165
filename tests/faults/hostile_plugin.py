"""A format plugin for the hostile-input tests (``source.format: "hostile_plugin:records"``).

An object's first line says what to do: ``RAISE <ExceptionName>`` raises that built-in
exception type after yielding one record, ``HANG`` sleeps for an hour (source.parse_timeout
must stop it), ``SWALLOW`` hangs while catching every ``Exception``; anything else yields each
non-empty line.
"""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator


def records(key: str, path: str) -> Iterator[bytes]:
    with open(path, "rb") as f:
        data = f.read()
    first = data.split(b"\n", 1)[0]
    if first.startswith(b"RAISE "):
        yield b"one record before the error"
        raise getattr(builtins, first.split()[1].decode())("hostile plugin input")
    if first == b"HANG":
        time.sleep(3600)
    if first == b"SWALLOW":
        while True:
            try:
                time.sleep(3600)
            except Exception:  # a plugin this careless must still be stopped
                continue
    yield from (line for line in data.split(b"\n") if line)
