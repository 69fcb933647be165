"""Output shards on the RAM disk.

A shard is written as ``ram_dir/.tmp/<shard>.part`` and published by renaming it into
``ram_dir/ready/``. Before a writer writes past what it has reserved, it extends its reservation
through ``budget.RamBudget`` (``posix_fallocate`` under the budget lock), so bytes under
``ram_dir`` never exceed ``output.ram_budget``. On publish the file is truncated to what was
written.

With ``output.compression: gzip`` the frames go through one gzip stream per shard (what
``TFRecordDataset(compression_type="GZIP")`` reads); sizes and reservations then count the
compressed bytes, which is what occupies the RAM disk.
"""

from __future__ import annotations

import contextlib
import logging
import os
import zlib
from collections.abc import Sequence
from pathlib import Path

from prefetchd.budget import RamBudget
from prefetchd.layout import TMP_SUFFIX, Layout, create_exclusive
from prefetchd.tfrecord import FOOTER, FRAME_OVERHEAD, frame_header, masked_crc

log = logging.getLogger(__name__)

_WRITE_BUFFER = 1024 * 1024
_IOV_MAX = 1024  # Linux's limit on the buffers of one writev
GZIP_LEVEL = 6  # zlib's default: the usual trade of CPU for size


def _write_all(fd: int, parts: Sequence[bytes | memoryview]) -> None:
    """``os.writev`` until every byte is written (a write may be partial)."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        done = os.writev(fd, views[:_IOV_MAX])
        while views and done >= len(views[0]):
            done -= len(views[0])
            views.pop(0)
        if done:
            views[0] = views[0][done:]


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

    def write_frames(self, parts: Sequence[bytes | memoryview], count: int) -> None:
        """Append ``count`` complete TFRecord frames, given back to back in ``parts``, with one
        (vectored) write."""
        if self._gzip is not None:
            for part in parts:
                self._write(self._gzip.compress(part))
        else:
            total = sum(len(memoryview(p)) for p in parts)
            self._reserve(self.size + total)
            self._file.flush()  # after any write_record
            _write_all(self._fd, parts)
            self.size += total
        self.records += count

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
