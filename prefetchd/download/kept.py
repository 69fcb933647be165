"""The kept store: raw objects ``download.keep`` holds on local disk across epochs and restarts.

Entries live in ``cache_dir/keep/`` under names made from the source identity of the object
(bucket, key, ETag, size; ``layout.kept_name``), never from the key itself, so a new job on the
same ``cache_dir`` finds them, and an object overwritten at the source (new ETag or size) simply
has another name. Each entry is two files, published in this order::

    keep/<id>.json  (key, etag, size, crc32c of the bytes; written by temp file + rename)
    ->  keep/<id>   (a hard link to the verified download, made just before it is handed on)

A crash between the two leaves a meta without data, swept at start-up with any temp file and
any data without its meta, so the store never holds half an entry. The data is a hard link to
the very file the writers read (no copy): a writer deleting its claimed file removes one name,
and the bytes stay under the other.

Trust on use: an entry is handed to the writers only if its ETag and size equal the current
listing's (the identity in its name), its file has the recorded size, and its CRC32C (one read
of the file, hardware CRC: several GB/s, paid by the downloader instead of a GET) equals the one
recorded when the download was verified. Anything else drops the entry, and the object is
downloaded again. Objects listed without an ETag (a manifest with sizes) are never kept: there
is no way to know they are unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import google_crc32c

from prefetchd.atomic import write_atomic
from prefetchd.download.order import SourceObject
from prefetchd.layout import is_meta, kept_name, meta_name, parse_kept_name, unmeta

log = logging.getLogger(__name__)

CHUNK = 4 * 1024 * 1024


@dataclass(frozen=True)
class Entry:
    """One kept object: its file's size and the CRC32C recorded when it was verified."""

    size: int
    crc32c: int


def file_crc32c(path: Path) -> tuple[int, int]:
    """``(size, crc32c)`` of the file at ``path``, read once."""
    crc, size = 0, 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(CHUNK):
            crc = google_crc32c.extend(crc, chunk)
            size += len(chunk)
    return size, crc


class KeptStore:
    """The entries of one ``keep/`` directory (for one bucket, or the buckets of several
    sources: ``name_of``); ``capacity`` bytes at most."""

    def __init__(self, directory: Path, bucket: str, capacity: int) -> None:
        self.directory = directory
        self.bucket = bucket
        self.capacity = capacity
        self.entries: dict[str, Entry] = {}
        self.used = 0

    def name_of(self, obj: SourceObject, bucket: str | None = None) -> str | None:
        """The entry name of ``obj`` as listed now (in ``bucket``, by default the store's);
        None if it cannot be kept (no ETag). Sources in several buckets share one store: the
        bucket is in the name, so an entry is found by what it is, whichever source (and in
        which epoch or period) reads it."""
        if not obj.etag:
            return None
        return kept_name(bucket or self.bucket, obj.key, obj.etag, obj.size)

    # --- start-up -----------------------------------------------------------------------------

    def load(self) -> None:
        """Learn the complete entries; delete temp files and half entries a crash left."""
        names = set(os.listdir(self.directory))
        for name in names:
            if name.startswith("."):  # write_atomic's temp file
                self._unlink(name)
            elif is_meta(name):
                self._load_meta(unmeta(name), names)
            elif meta_name(name) not in names:
                self._unlink(name)  # data without meta: not ours to trust

    def _load_meta(self, name: str, names: set[str]) -> None:
        entry = self._read_meta(name) if parse_kept_name(name) else None
        if entry is None or name not in names:
            self.drop(name)
            return
        self.entries[name] = entry
        self.used += entry.size

    def _read_meta(self, name: str) -> Entry | None:
        try:
            meta = json.loads((self.directory / meta_name(name)).read_bytes())
            return Entry(int(meta["size"]), int(meta["crc32c"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def retain(self, wanted: Iterable[str]) -> int:
        """Drop every entry not named in ``wanted`` (the policy's choice for the current
        listing: other objects, other jobs, overwritten objects); returns how many."""
        keep = set(wanted)
        dropped = [name for name in self.entries if name not in keep]
        for name in dropped:
            self.drop(name)
        return len(dropped)

    # --- use ----------------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        return name in self.entries

    def hand_over(self, name: str, dest: Path) -> str | None:
        """Link the entry ``name`` at ``dest`` if its bytes check out; otherwise drop it and
        return why (the caller downloads the object again)."""
        entry = self.entries[name]
        path = self.directory / name
        try:
            size, crc = file_crc32c(path)
        except OSError as exc:
            self.drop(name)
            return f"kept copy unreadable ({exc.strerror})"
        if (size, crc) != (entry.size, entry.crc32c):
            self.drop(name)
            return (
                f"kept copy corrupt on disk ({size} bytes, crc32c {crc:08x}; "
                f"kept {entry.size} bytes, crc32c {entry.crc32c:08x})"
            )
        try:
            os.link(path, dest)
        except OSError as exc:
            self.drop(name)
            return f"kept copy could not be linked ({exc.strerror})"
        return None

    def add(self, name: str, obj: SourceObject, path: Path) -> None:
        """Keep the verified download at ``path`` under ``name``. Raises ``OSError`` (e.g.
        ENOSPC) with nothing half-made left behind."""
        if name in self.entries or self.used + obj.size > self.capacity:
            return
        size, crc = file_crc32c(path)
        if size != obj.size:
            return  # the downloader publishes only the listed size; never keep anything else
        meta = {"key": obj.key, "etag": obj.etag, "size": size, "crc32c": crc}
        try:
            write_atomic(self.directory / meta_name(name), json.dumps(meta).encode())
            os.link(path, self.directory / name)
        except OSError:
            self.drop(name)
            raise
        self.entries[name] = Entry(size, crc)
        self.used += size

    def drop(self, name: str) -> None:
        """Remove an entry: its data first, so a crash in between leaves a meta that the next
        start-up sweeps, never data without the meta that vouches for it."""
        entry = self.entries.pop(name, None)
        if entry is not None:
            self.used -= entry.size
        self._unlink(name)
        self._unlink(meta_name(name))

    def _unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.directory / name)


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def disk_full(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


FreeBytes = Callable[[Path], int]
