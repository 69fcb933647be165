"""Spare files: the cache's inodes used again instead of deleted and created anew.

Every small object cost the cache filesystem two inodes made (its ``.part`` and its meta) and
two freed (the writer's deletes). On ext4 without a journal, making an inode checks every
recently freed one of its group (``recently_deleted``, via the buffer cache) before it picks
one: with the daemon's own churn, a few thousand inodes freed per second, that was 37 % of the
downloader's CPU per small object (``perf``, docs/benchmarks.md). A spare is an empty file in
``cache/.tmp`` that a writer made out of a file it was done with, and the downloader's next
``.part`` or meta instead of a new file:

- **a writer gives** (``SpareGiver.give``) a finished object's meta and bytes: truncated to
  nothing through an open + close (not ``truncate(2)`` on the path: on ext4 a file truncated to
  0 is flushed to disk at its next close, ``auto_da_alloc``, which would then be the
  downloader's close after it wrote the next object), then renamed to
  ``.tmp/spare-w<i>-<n>``, ``n`` cycling through ``MAX_SPARES``: a full pool replaces its
  oldest spare, whose inode is then freed as the delete would have. Only an empty file ever
  carries a spare's name, so whatever the downloader takes is empty.
- **the downloader takes** (``Spares.create``, ``Spares.write_new``) a spare by renaming it,
  never over an existing file (``renameat2(RENAME_NOREPLACE)``), to the ``.part`` or meta it
  was about to create; with none left (it lists ``.tmp`` again at most every
  ``RELIST_AFTER`` seconds) or where the rename is not supported, it creates the file as before.

Nothing of the exactly-once protocol (``exactly_once/__init__.py``) changes: a spare holds no
data and no name of an object; a ``.part`` or meta made from a spare is the same file, mode
0600, at the same name, as one created new. A writer that stops deletes the spares in ``.tmp``
(``SpareGiver.clear``), and the supervisor once every child has stopped (``delete_spares``: a
drained or finished daemon leaves nothing there); a crash leaves
at most empty spares, which the downloader's start-up sweep deletes with every other file there
that is not a logged ``.part`` (``download/restart.py``), as the job's wipe does
(``layout.is_own_file``).

With ``download.keep`` a fetched object may also be hard-linked into ``keep/``: emptying it
would empty the kept copy, so writers then delete as before (``SpareGiver(enabled=False)``).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import os
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

from prefetchd.atomic import write_all
from prefetchd.layout import is_spare, spare_name

# Per writer: the pool's inodes, all empty. A writer frees the objects of a shard together when
# it commits it (a 32 MiB shard holds ~270 objects of 120 KiB, two files each): a pool smaller
# than that replaced most of them at once, and the downloader found 12 % of its files there.
# The bound is for a downloader that takes none (renameat2 unsupported, or done downloading):
# 8192 empty inodes at most per writer, against the two per object in the window it frees.
MAX_SPARES = 8192
RELIST_AFTER = 0.05  # seconds between two listings of .tmp for spares, when none is left
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_CREATE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # as atomic.create_exclusive


def _renameat2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's ``renameat2`` (2.28 and later), None where it has none. No ``argtypes``: the
    arguments are passed as ``int`` and ``bytes``, which ctypes converts natively, and their
    per-call conversion through ``argtypes`` cost a fifth of the call (twice per object)."""
    try:
        func = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    func.restype = ctypes.c_int
    return func


_RENAMEAT2 = _renameat2()
_FS_ENCODING = sys.getfilesystemencoding()  # what os.fsencode uses, without its Python frame


def rename_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` unless ``dst`` exists (``FileExistsError``); ``OSError``
    with ``EINVAL`` or ``ENOSYS`` where the filesystem or the C library cannot."""
    if _RENAMEAT2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available")
    if _RENAMEAT2(
        _AT_FDCWD,
        src.encode(_FS_ENCODING, "surrogateescape"),
        _AT_FDCWD,
        dst.encode(_FS_ENCODING, "surrogateescape"),
        _RENAME_NOREPLACE,
    ):
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), src, None, dst)


class SpareGiver:
    """Writer ``writer``'s side: owns the next name it gives a spare (``spare-w<i>-<n>``)."""

    def __init__(self, tmp_dir: str | Path, writer: int, *, enabled: bool = True) -> None:
        self.tmp_dir = str(tmp_dir)
        self.writer = writer
        self.enabled = enabled
        self.next = 0

    def give(self, path: str) -> None:
        """Remove ``path`` from where it is: emptied and left in the pool as a spare, or
        deleted. A file already gone is no error (as ``unlink`` with ``missing_ok``)."""
        if not self.enabled:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        try:
            fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        os.close(fd)  # emptied: a spare is never renamed into the pool with bytes in it
        try:
            os.rename(path, f"{self.tmp_dir}/{spare_name(self.writer, self.next)}")
        except FileNotFoundError:
            return  # deleted meanwhile by someone else: gone, as asked
        self.next = (self.next + 1) % MAX_SPARES

    def clear(self) -> None:
        """Delete every spare the downloader did not take, when this writer stops: every
        writer's, not only its own (``delete_spares``). A spare another writer gives later
        is only a file the downloader makes again; one taken meanwhile is no longer a spare's
        name, and is not touched. The supervisor sweeps once more when every child is gone."""
        delete_spares(self.tmp_dir)


def delete_spares(tmp_dir: str | Path) -> None:
    """Delete the spares in ``tmp_dir``: a drained or finished daemon leaves no file in
    ``.tmp``. A writer does when it stops (``SpareGiver.clear``); the supervisor does once every
    child has stopped, for the spares a writer gave after the last one alive cleared — a writer
    SIGKILLed after giving them is not restarted once the job is done (the soak test found
    such spares left)."""
    try:
        names = os.listdir(tmp_dir)
    except FileNotFoundError:
        return
    for name in names:
        if is_spare(name):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{tmp_dir}/{name}")


class Spares:
    """The downloader's side: owns the names of the spares it listed and not yet used, and
    whether renaming them works here. Used from the main thread (``.part`` files) and the
    transfer threads (metas) at once: one per directory and process (``shared``), since two
    that listed the same names took each other's, and half their renames failed (``strace``)."""

    _shared: ClassVar[dict[str, Spares]] = {}
    _shared_lock = threading.Lock()

    @classmethod
    def shared(cls, tmp_dir: str | Path) -> Spares:
        """This process's ``Spares`` of ``tmp_dir``."""
        with cls._shared_lock:
            pool = cls._shared.get(str(tmp_dir))
            if pool is None:
                pool = cls._shared[str(tmp_dir)] = cls(tmp_dir)
            return pool

    def __init__(self, tmp_dir: str | Path) -> None:
        self.tmp_dir = str(tmp_dir)
        self.names: collections.deque[str] = collections.deque()
        self.listed_at = -RELIST_AFTER
        self.works = _RENAMEAT2 is not None
        self.taken = 0  # files made from a spare (for the cost tests and the profile)
        self._lock = threading.Lock()

    def take(self, dest: str) -> bool:
        """Rename a spare to ``dest``; False if there is none (or renaming cannot work here);
        ``FileExistsError`` if ``dest`` exists, which is never replaced."""
        while self.works:
            try:
                name = self.names.popleft()
            except IndexError:
                if not self._list():
                    return False
                continue
            try:
                rename_noreplace(f"{self.tmp_dir}/{name}", dest)
            except FileNotFoundError:
                continue  # swept, or replaced and taken: the next one
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
                    raise
                self.works = False  # this filesystem cannot: create files as before
                return False
            self.taken += 1
            return True
        return False

    def _list(self) -> bool:
        """List ``.tmp`` for spares if the last look is old enough; whether any was found."""
        with self._lock:
            if self.names:
                return True
            now = time.monotonic()
            if now - self.listed_at < RELIST_AFTER:
                return False
            self.listed_at = now
            try:
                # a list, not a generator: resuming one is a Python call per name listed
                self.names.extend([n for n in os.listdir(self.tmp_dir) if is_spare(n)])
            except FileNotFoundError:  # no cache tree (a transfer used on its own): none
                return False
            return bool(self.names)

    def create(self, path: str | Path, *, readable: bool = False) -> int:
        """``atomic.create_exclusive``, from a spare where there is one: a new empty private
        file at ``path``, open for writing (and reading); ``FileExistsError`` if it exists."""
        name = str(path)  # once: each pathlib conversion is a few Python calls, per object
        access = os.O_RDWR if readable else os.O_WRONLY
        if self.take(name):
            return os.open(name, access | os.O_NOFOLLOW | os.O_CLOEXEC)
        return os.open(name, access | _CREATE, 0o600)  # create_exclusive's, with no Path()

    def write_new(self, path: str | Path, data: bytes) -> bool:
        """``atomic.write_new``, from a spare where there is one: ``path`` created holding
        ``data``; False, writing nothing, if it exists. ``create``'s and ``write_all``'s steps
        inline (a meta per object: each call is per small object, issue 28)."""
        name = str(path)
        try:
            # take() when a spare is known or a listing is due (``listed_at`` read without the
            # lock: it only grows, and ``_list`` checks again under it); no call otherwise.
            if (
                self.names or (self.works and time.monotonic() - self.listed_at >= RELIST_AFTER)
            ) and self.take(name):
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            else:
                fd = os.open(name, os.O_WRONLY | _CREATE, 0o600)
        except FileExistsError:
            return False
        try:
            written = os.write(fd, data)
            if written < len(data):  # a short write (a signal, a full disk): the rest, or why
                write_all(fd, data[written:])
        finally:
            os.close(fd)
        return True
