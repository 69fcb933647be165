"""Read and write TFRecord files without TensorFlow: the public face of the record kernel's
framing (``prefetchd.kernel.framing``, which documents the format and each function)::

    from prefetchd.tfrecord import iter_records

    with open(path, "rb") as f:
        for record in iter_records(f):  # both CRCs of every frame checked
            ...

A bad CRC or a truncated frame raises ``FramingError`` (a ``ValueError``) with the byte offset
of the bad frame.
"""

from __future__ import annotations

from prefetchd.kernel.framing import (
    FramingError,
    RecordTooLong,
    frame,
    iter_records,
    masked_crc,
    read_records,
)

__all__ = ["FramingError", "RecordTooLong", "frame", "iter_records", "masked_crc", "read_records"]
