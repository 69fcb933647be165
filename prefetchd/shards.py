"""Output shards on the RAM disk, and the budget that bounds them.

A shard is written as ``ram_dir/.tmp/<shard>.part`` and published by renaming it into
``ram_dir/ready/``. Before a writer writes past what it has reserved, it takes the budget lock,
adds up the bytes under ``ram_dir`` and, if ``chunk`` more fit in ``output.ram_budget``,
reserves them with ``posix_fallocate``. The reservation is real allocation and shows in the
file's size, so the files themselves are the ledger every writer (and anyone running ``du``)
reads: bytes under ``ram_dir`` never exceed the budget. On publish the file is truncated to
what was written.

With ``output.compression: gzip`` the frames go through one gzip stream per shard (what
``TFRecordDataset(compression_type="GZIP")`` reads); sizes and reservations then count the
compressed bytes, which is what occupies the RAM disk.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import time
import zlib
from collections.abc import Callable
from pathlib import Path

from prefetchd.budget import ram_fits
from prefetchd.layout import TMP_SUFFIX, Layout, create_exclusive, dir_bytes
from prefetchd.tfrecord import FOOTER, FRAME_OVERHEAD, frame_header, masked_crc

log = logging.getLogger(__name__)

_WRITE_BUFFER = 1024 * 1024
GZIP_LEVEL = 6  # zlib's default: the usual trade of CPU for size


class Interrupted(Exception):
    """The process was asked to stop while waiting for room on the RAM disk."""


class RamBudget:
    """The writers' shared RAM ledger. ``headroom()`` is how much of the budget this writer
    must leave free right now (see ``Writer._headroom``); ``should_stop()`` is called while
    waiting and says whether to give up."""

    def __init__(
        self,
        layout: Layout,
        budget: int,
        chunk: int,
        should_stop: Callable[[], bool],
        headroom: Callable[[], int] = lambda: 0,
    ):
        self.layout = layout
        self.budget = budget
        self.chunk = chunk
        self.should_stop = should_stop
        self.headroom = headroom
        self.waited = 0.0  # seconds spent blocked on the budget (writer-side back-pressure)
        self.full_disk_waits = 0
        lock_fd = os.open(layout.budget_lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self._lock_fd = lock_fd

    def used(self) -> int:
        lay = self.layout
        # consumers/ too: each trainer's lock file carries its wait figures (256 bytes), and
        # the promise is about every byte under ram_dir.
        return dir_bytes(lay.ram_tmp, lay.ram_ready, lay.ram_claimed, lay.ram_consumers)

    def extend(self, fd: int, reserved: int, need: int) -> int:
        """Grow the reservation of ``fd`` from ``reserved`` to at least ``need``; blocks until the
        budget has room. Returns the new reservation."""
        grow = -(-(need - reserved) // self.chunk) * self.chunk
        started = time.monotonic()
        try:
            while True:
                if self._try(fd, reserved, grow):
                    return reserved + grow
                if self.should_stop():
                    raise Interrupted
                time.sleep(0.02)
        finally:
            self.waited += time.monotonic() - started

    def _try(self, fd: int, reserved: int, grow: int) -> bool:
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            if not ram_fits(self.used(), grow, self.budget - self.headroom()):
                return False
            try:
                os.posix_fallocate(fd, reserved, grow)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                self.full_disk_waits += 1
                if self.full_disk_waits in (1, 100) or self.full_disk_waits % 1000 == 0:
                    log.warning("the RAM disk %s is full; waiting for room", self.layout.ram)
                os.ftruncate(fd, reserved)
                return False
            return True
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)


class ShardFile:
    """One shard being written; ``publish()`` makes it visible to trainers atomically."""

    def __init__(self, layout: Layout, name: str, budget: RamBudget, *, gzip: bool = False) -> None:
        self.layout = layout
        self.name = name
        self.budget = budget
        self.tmp = layout.ram_tmp / (name + TMP_SUFFIX)
        self._fd = create_exclusive(self.tmp)
        self._file = os.fdopen(self._fd, "wb", buffering=_WRITE_BUFFER)
        self.size = 0
        self.records = 0
        self._reserved = 0
        # wbits 31: a gzip header and trailer around the deflate stream
        self._gzip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if gzip else None

    def write_record(self, data: bytes) -> None:
        """Append one TFRecord frame around ``data`` (see ``tfrecord.py`` for the layout)."""
        if self._gzip is not None:
            frame = frame_header(len(data)) + data + FOOTER.pack(masked_crc(data))
            self._write(self._gzip.compress(frame))
            self.records += 1
            return
        self._reserve(self.size + len(data) + FRAME_OVERHEAD)
        write = self._file.write
        write(frame_header(len(data)))
        write(data)
        write(FOOTER.pack(masked_crc(data)))
        self.size += len(data) + FRAME_OVERHEAD
        self.records += 1

    def _reserve(self, need: int) -> None:
        if need > self._reserved:
            self._file.flush()
            self._reserved = self.budget.extend(self._fd, self._reserved, need)

    def _write(self, chunk: bytes) -> None:
        if chunk:
            self._reserve(self.size + len(chunk))
            self._file.write(chunk)
            self.size += len(chunk)

    def finish(self) -> None:
        """Flush and trim the reservation; the file is complete but not yet visible."""
        if self._gzip is not None:
            self._write(self._gzip.flush())
        self._file.flush()
        os.ftruncate(self._fd, self.size)
        self._file.close()

    def publish(self) -> Path:
        target = self.layout.ram_ready / self.name
        os.rename(self.tmp, target)
        return target

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)
