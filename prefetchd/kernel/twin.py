"""The record kernel in pure Python: the fallback of the C kernel, and its reference
(``_native.c`` must give the same bytes for the same arguments; tests compare them, and fuzz
the sanitized C build against this module). Both are a ``protocol.RecordKernel``.

Batches are ``(data, ends)``: TFRecord frames back to back and the uint64 end offset of each
(see ``write/frames.py``). ``order`` and ``picks`` buffers hold native uint32. Every seeded
choice comes from ``SplitMix64``, so both kernels draw the same numbers from the same 64-bit
state.
"""

from __future__ import annotations

import os
import posixpath
import re
from array import array
from collections.abc import Sequence
from typing import Any

from prefetchd.kernel.example_encode import FeatureValue, encode_example
from prefetchd.kernel.framing import (
    FOOTER,
    FRAME_OVERHEAD,
    HEADER,
    HEADER_SIZE,
    FramingError,
    frame,
    index_records,
    masked_crc,
)
from prefetchd.kernel.protocol import TAR_END, TAR_FALLBACK

_M64 = (1 << 64) - 1
Batch = tuple[bytes, "array[int]"]


def _u32(buffer: Any) -> memoryview:
    return memoryview(buffer).cast("B").cast("I")


def _u64(buffer: Any) -> memoryview:
    return memoryview(buffer).cast("B").cast("Q")


def _batch(frames: list[bytes]) -> Batch:
    ends, total = array("Q"), 0
    for f in frames:
        total += len(f)
        ends.append(total)
    return b"".join(frames), ends


def frame_lines(
    buf: bytes, key: bytes, first: int, final: bool
) -> tuple[bytes, array[int], int, int]:
    """Frame each complete line of ``buf`` as Example{data, key, line_number}.

    Lines end at ``\\n`` (one ``\\r`` before it is dropped too); with ``final`` the rest after
    the last ``\\n`` is a line as well. Blank lines are skipped but counted. Returns ``(data,
    ends, consumed, next_line_number)``: the caller passes ``buf[consumed:]`` on with the next
    chunk. The same records as ``LinesFormat.records``.
    """
    end = len(buf) if final else buf.rfind(b"\n") + 1
    pieces = bytes(buf[:end]).split(b"\n")
    if end == 0 or buf[end - 1 : end] == b"\n":
        pieces.pop()  # what follows the last newline is not a line (yet)
    frames = []
    for number, piece in enumerate(pieces, start=first):
        data = piece.removesuffix(b"\r")
        if data:
            frames.append(frame(encode_example({"data": data, "key": key, "line_number": number})))
    data_out, ends = _batch(frames)
    return data_out, ends, end, first + len(pieces)


def frame_records(payloads: Sequence[bytes]) -> Batch:
    """Frame each payload."""
    return _batch([frame(p) for p in payloads])


def frame_examples(samples: list[list[tuple[bytes, FeatureValue]]]) -> Batch:
    """Frame each sample as a tf.train.Example: a list of ``(name, value)`` sorted by name
    (``example_encode.sorted_features``), values bytes or int64."""
    return _batch(
        [
            frame(encode_example({n.decode("utf-8", "surrogateescape"): v for n, v in s}))
            for s in samples
        ]
    )


def frame_file_example(
    sample: list[tuple[bytes, FeatureValue | None]], fd: int, size: int
) -> Batch | None:
    """One sample whose ``None`` value is the ``size`` bytes of file ``fd`` (from offset 0),
    framed as ``frame_examples`` frames it with those bytes as that value; None if the file
    does not hold exactly ``size`` bytes (the C kernel reads them straight into the frame)."""
    hole = next((i for i, (_, value) in enumerate(sample) if value is None), None)
    if hole is None:
        raise TypeError("frame_file_example() needs one None value")
    if size < 0:
        raise ValueError("negative size")
    data = _pread_all(fd, size + 1, enough=size)
    if len(data) != size:
        return None
    # A second None stays None: encode_example rejects it, as the C kernel does.
    filled = [(name, data if i == hole else value) for i, (name, value) in enumerate(sample)]
    return frame_examples([filled])  # type: ignore[list-item]


def _pread_all(fd: int, n: int, *, enough: int) -> bytes:
    """Up to ``n`` bytes of ``fd`` from offset 0: fewer only at the end of the file. Done
    once ``enough`` are in (a regular file's read is short only at its end: a read that
    stopped short of ``n`` there found the end), as the C kernel does: no read to probe
    the end."""
    chunks, got = [], 0
    while got < n:
        chunk = os.pread(fd, n - got, got)
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
        if got >= enough:
            break
    return b"".join(chunks)


_BLOCK = 512
TAR_SKIP_LIMIT = 1 << 20  # a larger member without extension: tarfile streams past it
_TAR_MAX_SIZE = 1 << 62
_TAR_NUMBERS = ((100, 8), (108, 8), (116, 8), (136, 12), (329, 8), (337, 8))
_OCTAL = re.compile(rb" *[0-7]* *\Z")
_ZEROS = bytes(_BLOCK)


def frame_tar(buf: bytes, final: bool, at_start: bool) -> tuple[bytes, array[int], int, int]:
    """Frame each complete sample of a chunk of a tar stream as Example{key, <ext>: data...}.

    ``buf`` starts at a member header (the stream's start when ``at_start``); ``final`` says
    the stream ends with it. Members are grouped into samples as ``formats/tar.py`` says; a
    sample is complete once a member of another sample, the end-of-archive block or (with
    ``final``) the end of the stream follows it. Returns ``(data, ends, consumed, status)``:

    - ``status > 0``: the tar goes on; call again with ``buf[consumed:]`` followed by more of
      the stream, at least ``status`` bytes in all;
    - ``TAR_END`` (0): the archive ended; nothing more is to be read;
    - ``TAR_FALLBACK`` (-1): a header or a sample only ``tarfile`` reads right (pax and GNU
      headers, bad checksums, odd number fields, non-ASCII extensions, a reserved or repeated
      extension, a member without extension over ``TAR_SKIP_LIMIT``, damage): the caller reads
      the object with ``tarfile``, skipping the samples framed so far.

    Frames are those of the samples complete before the status was decided; ``consumed`` is
    ``len(buf)`` unless ``status > 0``.
    """
    samples: list[tuple[bytes, dict[str, bytes]]] = []
    status, consumed = _tar_scan(buf, final, at_start, samples)
    frames = [frame(encode_example({"key": k, **members})) for k, members in samples]
    data, ends = _batch(frames)
    return data, ends, consumed, status


def check_tar(buf: bytes, final: bool, at_start: bool) -> tuple[int, int, int, int]:
    """``frame_tar`` without the frames: ``(samples, largest, consumed, status)``, where
    ``samples`` is how many frames it would give, ``largest`` the size of the largest (0 with
    none), and ``consumed`` and ``status`` are its own. The writer's read-through of an object
    needs only this verdict, so it skips the Examples and their CRCs."""
    samples: list[tuple[bytes, dict[str, bytes]]] = []
    status, consumed = _tar_scan(buf, final, at_start, samples)
    largest = max((_tar_frame_size(k, members) for k, members in samples), default=0)
    return len(samples), largest, consumed, status


def _tar_frame_size(key: bytes, members: dict[str, bytes]) -> int:
    """``len(frame(encode_example({"key": key, **members})))``, by arithmetic."""
    entries = _entry_size(b"key", len(key))
    entries += sum(_entry_size(name.encode(), len(data)) for name, data in members.items())
    return HEADER_SIZE + _field_size(entries) + FOOTER.size


def _entry_size(name: bytes, value: int) -> int:
    """One ``Features`` map entry: ``{key = name, value = Feature{BytesList{value}}}``."""
    return _field_size(_field_size(len(name)) + _field_size(_field_size(_field_size(value))))


def _field_size(payload: int) -> int:
    """A length-delimited field of a small field number: tag, varint length, payload."""
    return 1 + max(1, -(-payload.bit_length() // 7)) + payload


def _tar_scan(
    buf: bytes, final: bool, at_start: bool, samples: list[tuple[bytes, dict[str, bytes]]]
) -> tuple[int, int]:
    """``(status, consumed)`` of ``frame_tar``; appends the complete samples to ``samples``."""
    pos, open_at, is_open = 0, 0, False
    status, consumed = TAR_END, len(buf)
    while True:
        if len(buf) - pos < _BLOCK:
            if not final:
                consumed = open_at if is_open else pos
                status = pos + _BLOCK - consumed
            elif pos == 0 and at_start:
                status = TAR_FALLBACK  # tarfile: "empty file" or "truncated header"
            break  # else tarfile ends the archive quietly at a short header
        header = buf[pos : pos + _BLOCK]
        if header == _ZEROS:
            break
        member = _tar_header(header)
        if member is None or member[0] > _TAR_MAX_SIZE:
            status = TAR_FALLBACK
            break
        size, regular, name = member
        if not regular:
            pos += _BLOCK
            continue
        end = pos + _BLOCK + -(-size // _BLOCK) * _BLOCK
        parts = _tar_split(name)
        if parts is None and size > TAR_SKIP_LIMIT:
            status = TAR_FALLBACK
            break
        if parts is not None and not _tar_ext_ok(parts[1]):
            status = TAR_FALLBACK
            break
        if parts is not None and (not is_open or parts[0] != samples[-1][0]):
            samples.append((parts[0], {}))  # the last one is complete
            is_open, open_at = True, pos
        elif parts is not None and parts[1].decode() in samples[-1][1]:
            status = TAR_FALLBACK  # tarfile path: "appears twice in sample"
            break
        if end > len(buf):
            if final:
                status = TAR_FALLBACK  # tarfile: "unexpected end of data"
            else:
                consumed = open_at if is_open else pos
                status = end + _BLOCK - consumed
            break
        if parts is not None:
            samples[-1][1][parts[1].decode()] = bytes(buf[pos + _BLOCK : pos + _BLOCK + size])
        pos = end
    if is_open and status != TAR_END:
        samples.pop()
    return status, consumed


def _tar_number(field: bytes) -> int | None:
    """A number field as tarfile's ``nti`` reads it; None for a form left to tarfile (anything
    but positive base-256 below ``2**62``, or spaces, octal digits, spaces up to a NUL)."""
    if field[0] == 0x80:
        value = int.from_bytes(field[1:], "big")
        return value if value < _TAR_MAX_SIZE else None
    text = field.split(b"\0", 1)[0]
    if not _OCTAL.match(text):
        return None
    return int(text.strip(b" ") or b"0", 8)


def _tar_header(header: bytes) -> tuple[int, bool, bytes] | None:
    """``(size, regular, name)`` as tarfile's ``frombuf`` reads a header (the name with its
    ustar prefix); None for a header left to tarfile. ``regular`` is tarfile's ``isreg()``:
    data follows the header only then."""
    stored = _tar_number(header[148:156])
    rest = header[:148] + header[156:]
    sums = (256 + sum(rest), 256 + sum(memoryview(rest).cast("b")))
    size = _tar_number(header[124:136])
    numbers = [_tar_number(header[at : at + n]) for at, n in _TAR_NUMBERS]
    if stored not in sums or size is None or None in numbers:
        return None
    name = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0]
    kind = header[156:157]
    v7_dir = kind == b"\0" and name.endswith(b"/")
    if kind in (b"0", b"7") or (kind == b"\0" and not v7_dir):
        regular = True
    elif kind in (b"1", b"2", b"3", b"4", b"5", b"6") or v7_dir:
        regular = False  # links, devices, directories: tarfile skips no data after them
    else:
        return None  # pax, GNU long names, sparse files, vendor types
    return size, regular, prefix + b"/" + name if prefix else name


def _tar_split(name: bytes) -> tuple[bytes, bytes] | None:
    """``formats.tar.split_member`` on the undecoded name."""
    directory, filename = posixpath.split(name)
    base, dot, ext = filename.partition(b".")
    if not dot or not base or not ext:
        return None
    return posixpath.join(directory, base), ext


def _tar_ext_ok(ext: bytes) -> bool:
    # else the tarfile path raises ("reserved") or escapes the name (formats/tar.py)
    return ext != b"key" and ext.isascii() and b"%" not in ext


def index_file(fd: int, size: int) -> bytes:
    """The start offset of every frame of an uncompressed TFRecord file, as uint64 bytes;
    length CRCs checked. Raises ``FramingError`` (the C kernel: ``ValueError(offset,
    reason)``)."""
    return index_records(fd, size).tobytes()


def check_file(fd: int, size: int) -> None:
    """Every frame of the uncompressed TFRecord file of ``size`` bytes open as ``fd``, in file
    order: its header's length CRC, that its data and footer are there, its data CRC; the
    frames must end exactly at ``size``. Raises ``FramingError`` at the first fault (the C
    kernel: ``ValueError(offset, reason)``, reading 1 MiB at a time without the GIL)."""
    pos = 0
    while pos < size:
        header = os.pread(fd, HEADER_SIZE, pos) if size - pos >= HEADER_SIZE else b""
        if len(header) < HEADER_SIZE:
            raise FramingError(pos, "truncated record header")
        length, length_crc = HEADER.unpack(header)
        if masked_crc(header[:8]) != length_crc:
            raise FramingError(pos, "length CRC mismatch (not a TFRecord, or corrupt)")
        there = length <= size - pos - FRAME_OVERHEAD
        rest = os.pread(fd, length + FOOTER.size, pos + HEADER_SIZE) if there else b""
        if len(rest) < length + FOOTER.size:
            raise FramingError(pos, f"truncated record (expected {length} bytes of data)")
        if masked_crc(rest[:length]) != FOOTER.unpack_from(rest, length)[0]:
            raise FramingError(pos, "data CRC mismatch")
        pos += FRAME_OVERHEAD + length


def read_frames(
    fd: int, size: int, offsets: bytes, order: bytes, start: int, max_bytes: int
) -> tuple[bytes, array[int], int]:
    """The frames ``order[start:stop]`` of the file (offsets from ``index_file``), copied as
    they lie, data CRCs checked; ``stop`` is where the frames reach ``max_bytes`` (at least
    one frame). Returns ``(data, ends, stop)``."""
    offs, ordr = _u64(offsets), _u32(order)
    frames: list[bytes] = []
    total, stop = 0, start
    while stop < len(ordr) and (stop == start or total < max_bytes):
        i = ordr[stop]
        at = offs[i]
        length = (offs[i + 1] if i + 1 < len(offs) else size) - at
        f = os.pread(fd, length, at)
        if len(f) < length:
            raise FramingError(at, "truncated record (the file shrank)")
        if masked_crc(f[HEADER_SIZE:-4]) != FOOTER.unpack(f[-4:])[0]:
            raise FramingError(at, "data CRC mismatch")
        frames.append(f)
        total += length
        stop += 1
    data, ends = _batch(frames)
    return data, ends, stop


def _spans(parts: list[tuple[bytes, Any, int, int]]) -> list[memoryview]:
    spans: list[memoryview] = []
    for data, ends, lo, hi in parts:
        view, e = memoryview(data), _u64(ends)
        if not 0 <= lo <= hi <= len(e):
            raise IndexError("take(): part range out of bounds")
        spans.extend(view[(e[i - 1] if i else 0) : e[i]] for i in range(lo, hi))
    return spans


def take(parts: list[tuple[bytes, Any, int, int]], order: bytes, start: int, stop: int) -> Batch:
    """Frames ``lo..hi`` of each ``(data, ends, lo, hi)`` part, numbered across the parts, in
    the order ``order[start:stop]``."""
    spans = _spans(parts)
    return _batch([bytes(spans[i]) for i in _u32(order)[start:stop]])


def interleave(
    sources: list[tuple[bytes, Any]], cursors: Any, picks: bytes, start: int, limit: int
) -> tuple[bytes, int]:
    """Frames of ``sources`` in the order ``picks[start:]`` names them, each source from its
    cursor on (cursors advance in place), until ``limit`` bytes are reached, the picks run
    out, or a pick names a source with no frame left. Returns ``(data, stop)``: ``picks[stop]``
    is the first pick not taken."""
    views, stop = interleave_views(sources, cursors, picks, start, limit)
    return b"".join(views), stop


def interleave_views(
    sources: list[tuple[bytes, Any]], cursors: Any, picks: bytes, start: int, limit: int
) -> tuple[list[memoryview], int]:
    """``interleave`` without the copy: views of the frames, for a vectored write. Both cores
    use this one for large frames, where a Python step per frame costs nothing per byte and
    the copy would cost one pass over the data."""
    # Views of the picked sources only, made at their first pick: a step picks a few of the
    # open objects (~8 of 64 small raw objects), and viewing all of them cost more than the
    # step's own work.
    # Per pick no call but the append: the picks' count once, a source's frame count with
    # its views (the writer's small objects pay this per record: ``test_writer_batches``).
    viewed: dict[int, tuple[memoryview, memoryview, int]] = {}
    cur, pk = _u64(cursors), _u32(picks)
    out: list[memoryview] = []
    total, stop, picked = 0, start, len(pk)
    while stop < picked and total < limit:
        s = pk[stop]
        c = cur[s]
        if s in viewed:
            view, ends, count = viewed[s]
        else:
            data, ends_of = sources[s]
            ends = memoryview(ends_of).cast("B").cast("Q")  # ``_u64``, inline
            view, count = memoryview(data), len(ends)
            viewed[s] = (view, ends, count)
        if c >= count:
            break  # the caller refills source s
        begin = ends[c - 1] if c else 0
        out.append(view[begin : ends[c]])
        total += ends[c] - begin
        cur[s] = c + 1
        stop += 1
    return out, stop


class SplitMix64:
    """Sebastiano Vigna's SplitMix64; ``below(n)`` maps a draw to ``range(n)`` by
    multiply-shift (``_native.c`` does the same arithmetic)."""

    def __init__(self, state: int) -> None:
        self.position = state & _M64  # the generator's 64-bit state (not a process state)

    def next(self) -> int:
        self.position = z = (self.position + 0x9E3779B97F4A7C15) & _M64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        return (self.next() * n) >> 64


def permutation(n: int, state: int) -> tuple[bytes, int]:
    """A seeded permutation of ``range(n)`` (Fisher-Yates) as uint32 bytes, and the new state."""
    rng, p = SplitMix64(state), list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return array("I", p).tobytes(), rng.position


def picks(n: int, k: int, state: int) -> tuple[bytes, int]:
    """``k`` seeded draws from ``range(n)`` as uint32 bytes, and the new state."""
    rng = SplitMix64(state)
    return array("I", [rng.below(n) for _ in range(k)]).tobytes(), rng.position


def source_picks(
    groups: bytes, rates: bytes, credits: Any, k: int, state: int
) -> tuple[bytes, int]:
    """``k`` seeded draws from ``range(n)`` (``n`` slots, ``groups[i]`` the group of slot i),
    each first choosing a group by smooth weighted round robin and then a slot of it at random:
    every group that has a slot earns its ``rates[g]`` per draw in ``credits[g]`` (int64, moved
    in place), the one with the most credit (the lowest index on a tie) is chosen and pays the
    sum of those groups' rates, and the slot is ``below(its slots)`` among them in slot order.
    So any ``m`` consecutive draws give each group ``m * rate / sum`` of them to within the
    number of groups; a group without a slot neither earns nor is chosen. Returns the draws as
    uint32 bytes and the new SplitMix64 state."""
    slots, rate, credit = _u32(groups), _u64(rates), memoryview(credits).cast("B").cast("q")
    if not len(slots) or len(credit) != len(rate):
        raise ValueError("source_picks(): no slots, or not one credit per rate")
    members: list[list[int]] = [[] for _ in rate]
    for i, g in enumerate(slots):
        if g >= len(rate):
            raise IndexError("source_picks(): group out of range")
        members[g].append(i)
    present = [g for g in range(len(rate)) if members[g]]
    total = sum(rate[g] for g in present)
    if not total:
        raise ValueError("source_picks(): every present group has rate 0")
    rng, out = SplitMix64(state), array("I")
    c = [credit[g] for g in range(len(rate))]
    for _ in range(k):
        best = present[0]
        for g in present:
            c[g] += rate[g]
            if c[g] > c[best]:
                best = g
        c[best] -= total
        chosen = members[best]
        out.append(chosen[rng.below(len(chosen))])
    for g in range(len(rate)):
        credit[g] = c[g]
    return out.tobytes(), rng.position
