"""Which record kernel runs: the C one or its Python twin, chosen once at import.

``KERNEL`` is ``prefetchd.kernel._native`` (built by ``setup.py`` when a compiler is there)
once it has been given the address of a vetted CRC32C function, else ``prefetchd.kernel.twin``.
Both give the same bytes for the same input and seed (tested), and both are a
``RecordKernel`` (mypy checks it below). ``PREFETCHD_NATIVE=0`` in the environment forces
Python. ``ACTIVE`` says which one runs, for the log and ``prefetchd check``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from prefetchd.kernel import twin
from prefetchd.kernel.framing import FramingError
from prefetchd.kernel.protocol import RecordKernel

if TYPE_CHECKING:  # mypy's proof that both implementations keep the contract
    from prefetchd.kernel import _native

    _C: RecordKernel = _native
    _PYTHON: RecordKernel = twin

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


def _load() -> tuple[RecordKernel, str]:
    """The C kernel if it is built, enabled and has a CRC32C, else the twin; and why.
    (The reasons keep their words: ``prefetchd check`` and the writers' log show them.)"""
    if os.environ.get("PREFETCHD_NATIVE", "1") == "0":
        return twin, "python (PREFETCHD_NATIVE=0)"
    try:
        from prefetchd.kernel import _native
    except ImportError:
        return twin, "python (the C core prefetchd.kernel._native is not built)"
    address = crc32c_address()
    if address is None:
        return twin, "python (no libcrc32c found for the C core)"
    try:
        _native.set_crc32c(address)
    except ValueError as exc:
        return twin, f"python (the C core refused libcrc32c: {exc})"
    return _native, "native (C core with libcrc32c)"


KERNEL, ACTIVE = _load()


def framing_error(exc: ValueError) -> FramingError:
    """The ``FramingError`` a kernel raised: the twin raises it as such, C as
    ``ValueError(offset, reason)``."""
    if isinstance(exc, FramingError):
        return exc
    if len(exc.args) != 2 or not isinstance(exc.args[0], int):
        raise exc  # not a framing error: a bug, not bad input
    offset, reason = exc.args
    return FramingError(offset, str(reason))
