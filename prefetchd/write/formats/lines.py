"""``lines``: each line of a text, JSONL or CSV object -> Example with ``key``, ``line_number``
and ``data``.

``data`` is the line's bytes without its line ending (``\\n`` or ``\\r\\n``), undecoded;
``line_number`` counts from 1 as editors do. Blank lines are skipped (they still count, so
line numbers always match the file); a CSV header is an ordinary line (``line_number`` 1).
Lines stream from disk: memory is one line (or a 1 MiB chunk of lines), whatever the object's
size.
"""

from __future__ import annotations

from collections.abc import Iterator

from prefetchd.write import core
from prefetchd.write.example import encode_example
from prefetchd.write.formats.compressed import open_object
from prefetchd.write.frames import BATCH_BYTES, Frames


class LinesFormat:
    def records(self, key: str, path: str) -> Iterator[bytes]:
        key_bytes = key.encode("utf-8", "surrogateescape")
        with open_object(key, path) as f:
            for number, line in enumerate(f, start=1):
                data = line.rstrip(b"\n").removesuffix(b"\r")
                if data:
                    yield encode_example({"key": key_bytes, "line_number": number, "data": data})

    def frames(self, key: str, path: str) -> Iterator[Frames]:
        """The records of ``records``, framed a chunk of lines per call (``frame_lines``)."""
        key_bytes = key.encode("utf-8", "surrogateescape")
        number = 1
        pending = b""
        with open_object(key, path, buffered=False) as f:
            while True:
                # a line longer than a chunk doubles the read until its newline is in
                chunk = f.read(max(BATCH_BYTES, len(pending)))
                buf = pending + chunk if pending else chunk
                data, ends, used, number = core.IMPL.frame_lines(buf, key_bytes, number, not chunk)
                if len(data):
                    yield Frames.of(data, ends)
                if not chunk:
                    return
                pending = buf[used:]
