"""Which implementation of the writer's per-batch operations runs: the C core or Python.

``IMPL`` is ``prefetchd.write._native`` (built by ``setup.py`` when a compiler is there) once
it has been given the address of a vetted CRC32C function, else ``prefetchd.write.pycore``.
Both give the same bytes for the same input and seed (tested). ``PREFETCHD_NATIVE=0`` in the
environment forces Python. ``ACTIVE`` says which one runs, for the log and
``prefetchd check``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from pathlib import Path
from types import ModuleType

from prefetchd.tfrecord import FramingError
from prefetchd.write import pycore

log = logging.getLogger(__name__)


def crc32c_address() -> int | None:
    """The address of ``crc32c_extend(crc, data, len)`` from Google's libcrc32c: the copy the
    google-crc32c wheel bundles, else a system one; None if neither loads."""
    try:
        import google_crc32c
    except ImportError:
        return None
    libs = Path(google_crc32c.__file__).resolve().parent.parent / "google_crc32c.libs"
    for name in sorted(libs.glob("libcrc32c*.so*")):
        address = _extend_address(str(name))
        if address:
            return address
    system = ctypes.util.find_library("crc32c")  # runs ldconfig: only when needed
    return _extend_address(system) if system else None


def _extend_address(library: str) -> int | None:
    try:
        function = ctypes.CDLL(library).crc32c_extend
    except (OSError, AttributeError):
        return None
    address = ctypes.cast(function, ctypes.c_void_p).value
    return int(address) if address else None


def _load() -> tuple[ModuleType, str]:
    """The C core if it is built, enabled and has a CRC32C, else Python; and why."""
    if os.environ.get("PREFETCHD_NATIVE", "1") == "0":
        return pycore, "python (PREFETCHD_NATIVE=0)"
    try:
        from prefetchd.write import _native
    except ImportError:
        return pycore, "python (the C core prefetchd.write._native is not built)"
    address = crc32c_address()
    if address is None:
        return pycore, "python (no libcrc32c found for the C core)"
    try:
        _native.set_crc32c(address)
    except ValueError as exc:
        return pycore, f"python (the C core refused libcrc32c: {exc})"
    return _native, "native (C core with libcrc32c)"


IMPL, ACTIVE = _load()


def framing_error(exc: ValueError) -> FramingError:
    """The ``FramingError`` a core raised: Python raises it as such, C as
    ``ValueError(offset, reason)``."""
    if isinstance(exc, FramingError):
        return exc
    if len(exc.args) != 2 or not isinstance(exc.args[0], int):
        raise exc  # not a framing error: a bug, not bad input
    offset, reason = exc.args
    return FramingError(offset, str(reason))
