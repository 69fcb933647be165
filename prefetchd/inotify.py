"""A minimal inotify binding (Linux): the kernel tells us when files are opened, closed,
created or deleted, so no process has to poll directories with thousands of entries.

Used by the downloader (a writer deleted a raw file: the window has room), by writers (a new
object was published) and by trainers (a claimed shard was opened and closed again).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import select
import struct
from dataclasses import dataclass
from pathlib import Path

IN_ACCESS = 0x001
IN_CLOSE_WRITE = 0x008
IN_CLOSE_NOWRITE = 0x010
IN_OPEN = 0x020
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_CLOSE = IN_CLOSE_WRITE | IN_CLOSE_NOWRITE

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")
_READ_SIZE = 64 * 1024

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


@dataclass(frozen=True, slots=True)
class Event:
    mask: int
    name: str

    @property
    def overflow(self) -> bool:
        return bool(self.mask & IN_Q_OVERFLOW)


class Watch:
    """Watch one directory (or more, ``add``) for ``mask`` events on the files in it."""

    def __init__(self, directory: Path, mask: int) -> None:
        fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_init1: {os.strerror(err)}")
        self._fd: int = fd
        wd = _libc.inotify_add_watch(fd, os.fsencode(directory), mask)
        if wd < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, f"inotify_add_watch {directory}: {os.strerror(err)}")
        self._poll = select.poll()
        self._poll.register(fd, select.POLLIN)

    def add(self, directory: Path, mask: int) -> None:
        """Watch ``directory`` too (its events come mixed with the first one's); raises
        ``OSError`` if it cannot be watched (missing, not readable)."""
        if _libc.inotify_add_watch(self._fd, os.fsencode(directory), mask) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"inotify_add_watch {directory}: {os.strerror(err)}")

    def read(self, timeout: float | None) -> list[Event]:
        """Events that arrived, waiting up to ``timeout`` seconds (None: forever) for the first."""
        if timeout != 0 and not self.wait(timeout):
            return []
        return self.read_now()

    def wait(self, timeout: float | None) -> bool:
        """Whether events are waiting, after up to ``timeout`` seconds (None: forever)."""
        return bool(self._poll.poll(None if timeout is None else max(0, int(timeout * 1000))))

    def read_now(self) -> list[Event]:
        """The events already queued, without waiting."""
        events: list[Event] = []
        while True:
            try:
                buf = os.read(self._fd, _READ_SIZE)
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
                    return events
                raise
            offset = 0
            while offset < len(buf):
                _, mask, _, length = _EVENT.unpack_from(buf, offset)
                offset += _EVENT.size
                raw = buf[offset : offset + length].rstrip(b"\x00")
                offset += length
                if not mask & IN_IGNORED:
                    events.append(Event(mask, os.fsdecode(raw)))
            if len(buf) < _READ_SIZE - _EVENT.size - 256:
                # Room was left for another event: the queue was empty when read. Not
                # asking again saves a read (and its EAGAIN) per wake-up; later events
                # are the next call's.
                return events

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
