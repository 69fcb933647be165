"""This host's share of the source, held compactly: millions of keys in a few flat arrays.

A list of one Python object per key costs ~200 bytes of overhead per key (object header,
``str``, ``int``), ~200 MB for a million keys. ``ShareTable`` keeps every key's UTF-8 bytes in
one ``bytearray`` with an ``array`` of end offsets, and sizes and ETags the same way: memory is
the keys themselves plus ~24 bytes per key (+ the ETag's text when the listing gave one).
Objects are materialized one at a time, when the downloader schedules them.

The table is sorted by key (the order epochs are shuffled from, so the listing's arrival order
does not matter) and holds each key once. Listings arrive sorted; an unsorted manifest is
sorted once when the table is finished, without a Python object per key.
"""

from __future__ import annotations

import hashlib
import heapq
from array import array
from collections.abc import Iterable, Iterator

from prefetchd.download.order import SourceObject
from prefetchd.exactly_once.trained_objects import ListingId

_ENCODING = "utf-8"
_ERRORS = "surrogatepass"  # keys round-trip exactly; UTF-8 byte order is code point order
SORT_RUN = 65536


class ListingDigest:
    """The ``ListingId`` of a share fed object by object in key order: their count and the
    first 16 hex digits of a sha256 over each key, size and ETag (what makes the epoch orders
    and the objects' records; ``trained_objects.py``). ``ShareTable.identity`` feeds the same
    bytes."""

    def __init__(self) -> None:
        self.n = 0
        self._hash = hashlib.sha256()

    def add(self, obj: SourceObject) -> None:
        etag = (obj.etag or "").encode("ascii", "replace")  # as ShareTable keeps it
        self.add_raw(obj.key.encode(_ENCODING, _ERRORS), obj.size, etag)

    def add_raw(self, key: bytes, size: int, etag: bytes) -> None:
        self.n += 1
        self._hash.update(b"%s\0%d\0%s\n" % (key, size, etag))

    def identity(self) -> ListingId:
        return ListingId(self.n, self._hash.hexdigest()[:16])


class ShareTable:
    """An append-then-read table of ``SourceObject``; call ``finish()`` before reading."""

    def __init__(self) -> None:
        self._keys = bytearray()
        self._key_ends = array("Q")
        self._sizes = array("Q")
        self._etags = bytearray()
        self._etag_ends = array("Q")
        self._last = b""
        self._in_order = True
        self._order: array[int] | None = None  # sorted position -> row, when rows are not
        self._finished = False
        self.duplicates = 0  # keys listed more than once (manifests), dropped by finish()

    @classmethod
    def of(cls, objects: Iterable[SourceObject]) -> ShareTable:
        table = cls()
        for obj in objects:
            table.append(obj)
        table.finish()
        return table

    def append(self, obj: SourceObject) -> None:
        if self._finished:
            raise RuntimeError("ShareTable appended to after finish()")
        key = obj.key.encode(_ENCODING, _ERRORS)
        if self._key_ends and key <= self._last:
            self._in_order = False
        self._last = key
        self._keys += key
        self._key_ends.append(len(self._keys))
        self._sizes.append(obj.size)
        if obj.etag:
            self._etags += obj.etag.encode("ascii", "replace")
        self._etag_ends.append(len(self._etags))

    def finish(self) -> None:
        """Sort by key (only if the input was not sorted) and drop repeated keys.

        Sorting is a merge of sorted runs of ``SORT_RUN`` rows, so it holds the keys of one
        run at a time plus an 8-byte position per key, never a Python object per key.
        """
        if not self._in_order:
            rows = range(len(self._key_ends))
            runs = [
                array("Q", sorted(rows[i : i + SORT_RUN], key=self._row_key))
                for i in range(0, len(rows), SORT_RUN)
            ]
            order = array("Q")
            previous: bytes | None = None
            for row in heapq.merge(*runs, key=self._row_key):
                key = self._row_key(row)
                if key == previous:
                    self.duplicates += 1
                    continue
                previous = key
                order.append(row)
            self._order = order
        self._finished = True

    def __len__(self) -> int:
        return len(self._order) if self._order is not None else len(self._key_ends)

    def _row_key(self, row: int) -> bytes:
        start = self._key_ends[row - 1] if row else 0
        return bytes(self._keys[start : self._key_ends[row]])

    def __getitem__(self, i: int) -> SourceObject:
        """The ``i``-th object in key order."""
        if not self._finished:
            raise RuntimeError("ShareTable read before finish()")
        row = self._order[i] if self._order is not None else i
        start = self._etag_ends[row - 1] if row else 0
        etag = self._etags[start : self._etag_ends[row]]
        return SourceObject(
            self._row_key(row).decode(_ENCODING, _ERRORS),
            self._sizes[row],
            etag.decode("ascii") if etag else None,
        )

    def __iter__(self) -> Iterator[SourceObject]:
        return (self[i] for i in range(len(self)))

    def identity(self) -> ListingId:
        """The table's ``ListingId`` (over its objects in key order), from its arrays: no
        ``SourceObject`` per key (~0.5 CPU-s per million keys)."""
        digest = ListingDigest()
        keys, key_ends, etags, etag_ends = self._keys, self._key_ends, self._etags, self._etag_ends
        for i in range(len(self)):
            row = self._order[i] if self._order is not None else i
            key_start = key_ends[row - 1] if row else 0
            etag_start = etag_ends[row - 1] if row else 0
            digest.add_raw(
                bytes(keys[key_start : key_ends[row]]),
                self._sizes[row],
                bytes(etags[etag_start : etag_ends[row]]),
            )
        return digest.identity()

    def sizes(self) -> array[int]:
        """Every object's size, in key order (what an epoch of several sources is planned on)."""
        if self._order is None:
            return array("Q", self._sizes)
        return array("Q", (self._sizes[row] for row in self._order))

    def total_size(self) -> int:
        if self._order is None:
            return sum(self._sizes)
        return sum(self._sizes[row] for row in self._order)

    def nbytes(self) -> int:
        """Bytes the table holds (for the log: what the listing costs in memory)."""
        arrays = [self._key_ends, self._sizes, self._etag_ends]
        if self._order is not None:
            arrays.append(self._order)
        return len(self._keys) + len(self._etags) + sum(a.itemsize * len(a) for a in arrays)
