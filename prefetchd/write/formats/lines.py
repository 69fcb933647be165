"""``lines``: each line of a text, JSONL or CSV object -> Example with ``key``, ``line_number``
and ``data``.

``data`` is the line's bytes without its line ending (``\\n`` or ``\\r\\n``), undecoded;
``line_number`` counts from 1 as editors do. Blank lines are skipped (they still count, so
line numbers always match the file); a CSV header is an ordinary line (``line_number`` 1).
Lines stream from disk: memory is one line (or a 1 MiB chunk of lines), whatever the object's
size. A line longer than ``output.max_record_size`` raises ``RecordTooLarge`` once that many
bytes were read without a line end: a huge line is never held whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from prefetchd.config import DEFAULT_MAX_RECORD_SIZE
from prefetchd.kernel import choice
from prefetchd.kernel.example_encode import encode_example
from prefetchd.write.formats.compressed import compression_of, open_object
from prefetchd.write.frames import BATCH_BYTES, Frames
from prefetchd.write.quarantine import RecordTooLarge


class LinesFormat:
    def __init__(self, max_record_size: int = DEFAULT_MAX_RECORD_SIZE) -> None:
        self.max_record_size = max_record_size

    def read_whole_first(self, key: str, path: str) -> bool:
        """Nothing in an uncompressed object no larger than ``max_record_size`` can fail: every
        byte sequence is lines, and no line can be over the limit. So the writer need not read
        it through before taking its records (a compressed stream can be truncated or
        garbage, and a larger object can hold a line over the limit)."""
        return compression_of(key) is None and os.path.getsize(path) <= self.max_record_size

    def records(self, key: str, path: str) -> Iterator[bytes]:
        key_bytes = key.encode("utf-8", "surrogateescape")
        # a line ending (\r\n) is not part of the line's data: allow it on top of the limit
        most = self.max_record_size + 2
        with open_object(key, path) as f:
            for number, line in enumerate(iter(lambda: f.readline(most + 1), b""), start=1):
                data = line.rstrip(b"\n").removesuffix(b"\r")
                if len(data) > self.max_record_size:
                    raise RecordTooLarge(key, f"line {number}", len(data), self.max_record_size)
                if data:
                    yield encode_example({"key": key_bytes, "line_number": number, "data": data})

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The records of ``records``, framed a chunk of lines per call (``frame_lines``)."""
        key_bytes = key.encode("utf-8", "surrogateescape")
        number = 1
        pending = b""
        with open_object(key, path, buffered=False) as f:
            while True:
                # a line longer than a chunk doubles the read until its newline is in, up to
                # the limit (and its line end): a longer line is refused before it is held
                chunk = f.read(
                    max(BATCH_BYTES, min(len(pending), self._room(key, number, pending)))
                )
                carried, final = bool(pending), not chunk
                buf = pending + chunk if pending else chunk
                # let go of the parts before framing: a line near the limit would otherwise be
                # held three times (its parts, buf and its frame)
                pending = chunk = b""
                if carried:
                    self._check_first_line(key, number, buf, final=final)
                data, ends, used, number = choice.KERNEL.frame_lines(buf, key_bytes, number, final)
                # drop the input before handing the frames on: a suspended generator would
                # otherwise hold a large line twice (its bytes and its frame) per open object
                pending, buf = buf[used:], b""
                if len(data):
                    yield Frames.of(data, ends)
                if final:
                    return

    def _room(self, key: str, number: int, pending: bytes) -> int:
        """How much more a carried partial line may grow; raises once it is over the limit."""
        most = self.max_record_size + 2  # the line and a \r\n
        if len(pending) > most:
            raise RecordTooLarge(key, f"line {number}", len(pending), self.max_record_size)
        return most + 1 - len(pending)

    def _check_first_line(self, key: str, number: int, buf: bytes, *, final: bool) -> None:
        """Refuse the carried line (at the start of ``buf``) if it is over the limit. The
        lines after it lie within one read, at most ``max(BATCH_BYTES, limit + 3)`` long."""
        limit = self.max_record_size
        end = buf.find(b"\n", 0, limit + 2)
        if end < 0 and not final and len(buf) < limit + 2:
            return  # its end is not read yet: checked again with the next read
        end = end if end >= 0 else len(buf)
        size = end - (1 if buf[end - 1 : end] == b"\r" else 0)
        if size > limit:
            raise RecordTooLarge(key, f"line {number}", size, limit)
