"""Output shards on the RAM disk.

A shard is written as ``ram_dir/.tmp/<shard>.part`` and published by renaming it into
``ram_dir/ready/``. Before a writer writes past what it has reserved, it extends its reservation
through ``budget.RamBudget`` (the file's size, grown under the budget lock), so bytes under
``ram_dir`` never exceed ``output.ram_budget``. Writes go straight to the file (``writev``, no
buffer), so a RAM disk that is itself full (ENOSPC) is met where it happens and waited out
(``RamBudget.disk_full``) without losing or repeating a byte. On publish the file is truncated
to what was written.

With ``output.compression: gzip`` the frames go through one gzip stream per shard (what
``TFRecordDataset(compression_type="GZIP")`` reads); sizes and reservations then count the
compressed bytes, which is what occupies the RAM disk.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import zlib
from collections.abc import Callable, Sequence
from operator import methodcaller
from pathlib import Path

from prefetchd.atomic import create_exclusive
from prefetchd.budget import RamBudget
from prefetchd.kernel.framing import FOOTER, frame_header
from prefetchd.layout import Layout
from prefetchd.tfrecord import masked_crc

log = logging.getLogger(__name__)

_IOV_MAX = 1024  # Linux's limit on the buffers of one writev
GZIP_LEVEL = 6  # zlib's default: the usual trade of CPU for size
_VIEW: Callable[[bytes | memoryview], memoryview] = memoryview
_AS_BYTES: Callable[[memoryview], memoryview] = methodcaller("cast", "B")


def _byte_views(parts: Sequence[bytes | memoryview]) -> list[memoryview]:
    """``parts`` as byte views, made by ``map``: with small records the views path writes one
    part per record, and a Python call per part cost each small object one."""
    return list(map(_AS_BYTES, map(_VIEW, parts)))


def _write_all(
    fd: int, views: list[memoryview], disk_full: Callable[[], None], total: int = -1
) -> None:
    """``os.writev`` of ``views`` (``_byte_views``; ``total`` bytes, if known) until every byte
    is written (a write may be partial); on ENOSPC (nothing of that call written)
    ``disk_full()`` waits, then the rest is written again. A first write that took all of
    ``total``, the usual case, returns without a pass over the parts."""
    while views:
        try:
            done = os.writev(fd, views[:_IOV_MAX])
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            disk_full()
            continue
        if done == total and len(views) <= _IOV_MAX:
            return
        total = -1  # the rest's size is not kept
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
        self.tmp = layout.shard_part(name)
        self._fd = create_exclusive(self.tmp)
        self._closed = False
        self.size = 0
        self.records = 0
        self._reserved = 0
        # wbits 31: a gzip header and trailer around the deflate stream
        self._gzip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31) if gzip else None

    def write_record(self, data: bytes) -> None:
        """Append one TFRecord frame around ``data`` (see ``tfrecord.py`` for the layout)."""
        header, footer = frame_header(len(data)), FOOTER.pack(masked_crc(data))
        self.write_frames([header, data, footer], 1)

    def write_frames(self, parts: Sequence[bytes | memoryview], count: int) -> None:
        """Append ``count`` complete TFRecord frames, given back to back in ``parts``, with one
        (vectored) write."""
        if self._gzip is not None:
            for part in parts:
                self._write(self._gzip.compress(part))
        else:
            views = _byte_views(parts)
            total = sum(map(len, views))  # byte views: their lengths are bytes
            self._reserve(self.size + total)
            _write_all(self._fd, views, self.budget.disk_full, total)
            self.size += total
        self.records += count

    def _reserve(self, need: int) -> None:
        if need > self._reserved:
            self._reserved = self.budget.extend(self._fd, self._reserved, need)

    def _write(self, chunk: bytes) -> None:
        """Append ``chunk`` (gzip output: the deflate stream comes in pieces of a few KiB to
        tens of KiB, written as they come)."""
        if chunk:
            self._reserve(self.size + len(chunk))
            _write_all(self._fd, _byte_views([chunk]), self.budget.disk_full, len(chunk))
            self.size += len(chunk)

    def finish(self) -> None:
        """Write the rest and trim the reservation; the file is complete but not yet visible."""
        if self._gzip is not None:
            self._write(self._gzip.flush())
        os.ftruncate(self._fd, self.size)
        self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            os.close(self._fd)

    def publish(self) -> Path:
        target = self.layout.ram_ready / self.name
        os.rename(self.tmp, target)
        return target

    def discard(self) -> None:
        self._close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.tmp)
