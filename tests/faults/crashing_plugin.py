"""Format plugins for the fault tests (``source.format: "crashing_plugin:<function>"``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

from prefetchd.kernel.framing import read_records

POISON = "000003"


def dies(key: str, path: str) -> Iterator[bytes]:
    """Kills its writer process (as a segfaulting native parser would) on one object."""
    if POISON in key:
        os._exit(1)
    with open(path, "rb") as f:
        yield from read_records(f)


def raises(key: str, path: str) -> Iterator[bytes]:
    """Raises on one object after yielding nothing: the object is quarantined."""
    if POISON in key:
        raise ValueError("cannot parse this sample")
    with open(path, "rb") as f:
        yield from read_records(f)
