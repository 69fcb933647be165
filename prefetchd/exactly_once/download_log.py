"""The download log: the objects of an epoch the downloader is done with, one line each.

``progress/e<k>.log`` holds an ASCII line per object of epoch k that is finished for good::

    P <hash>    published: its meta is written, this line appended, then its .part renamed
                into ready/ (the line is the download's commit point)
    S <hash>    skipped: given up for this epoch (deleted, overwritten, denied, corrupt...)

``<hash>`` is the last field of the object's local name (the hash of bucket and key). Lines are
only appended, one ``write`` each on a file kept open; a line a crash cut short has one field and
is ignored, and the next line starts on a line of its own: a log found not ending in a newline
is ended first (once, when it is opened). A full disk can cut a ``write`` short (a line across
a block boundary): the piece is cut off again (``ftruncate``) and the append fails with ENOSPC,
so a piece never joins the next line and hides it. On restart the downloader rolls forward a
``.part`` whose hash is logged, fetches any other again, and fetches no logged object again
(unless its file vanished from ``ready/``). The supervisor removes an epoch's log once the
epoch is complete.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from prefetchd.atomic import open_append
from prefetchd.layout import Layout, object_digest

PUBLISHED = "P"
SKIPPED = "S"


class DownloadLog:
    """The per-epoch download logs (``layout.download_log(k)``): read at start-up,
    appended to while downloading. Owns each epoch's file descriptor, open for appending from
    its first line until ``close(epoch)``."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._fds: dict[int, int] = {}  # epoch -> its log, open for appending

    def path(self, epoch: int) -> Path:
        return self.layout.download_log(epoch)

    def epochs(self) -> list[int]:
        """The epochs that have a log on disk (not yet complete), in order."""
        return self.layout.download_log_epochs()

    def read(self, epoch: int) -> set[str]:
        """The hashes logged for ``epoch``, published or skipped; empty if it has no log."""
        try:
            with self.path(epoch).open(encoding="ascii") as f:
                return {line.split()[1] for line in f if len(line.split()) == 2}
        except FileNotFoundError:
            return set()

    def append(self, epoch: int, name: str, kind: str) -> None:
        """Log the object of local name ``name`` as ``kind`` (``PUBLISHED`` or ``SKIPPED``)."""
        fd = self._fds.get(epoch)
        if fd is None:  # kept open: one write per object, not open + write + close
            fd = self._fds[epoch] = self._open(epoch)
        line = f"{kind} {object_digest(name)}\n".encode("ascii")
        written = os.write(fd, line)
        if written != len(line):  # a full disk: the piece would join the next line
            os.ftruncate(fd, os.fstat(fd).st_size - written)
            raise OSError(
                errno.ENOSPC, "the download log's line was cut short", str(self.path(epoch))
            )

    def _open(self, epoch: int) -> int:
        """Epoch ``epoch``'s log, open for appending, ending with a whole line: one a crash
        cut short (a power loss: lines are not synced) is ended, so the next is its own."""
        path = self.path(epoch)
        fd = open_append(path)
        try:
            if os.fstat(fd).st_size:
                with open(path, "rb") as log:
                    log.seek(-1, os.SEEK_END)
                    cut = log.read(1) != b"\n"
                if cut and os.write(fd, b"\n") != 1:
                    raise OSError(errno.ENOSPC, "the download log cannot be ended", str(path))
        except BaseException:
            os.close(fd)
            raise
        return fd

    def close(self, epoch: int) -> None:
        """Nothing more will be logged for ``epoch``: close its file if it is open."""
        fd = self._fds.pop(epoch, None)
        if fd is not None:
            os.close(fd)

    def close_all(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
