"""The record kernel's contract: the per-batch operations both implementations offer.

``RecordKernel`` is what ``choice.KERNEL`` is: the C module ``prefetchd.kernel._native`` or its
pure-Python twin ``prefetchd.kernel.twin``, which give the same bytes for the same arguments
(tests compare them, and fuzz the sanitized C build against the twin). mypy checks that both
modules satisfy the Protocol (``choice.py``). Each operation's contract is documented once, on
the twin's function of the same name.

Batches are ``(data, ends)``: TFRecord frames back to back and the native uint64 end offset of
each (``bytes`` from C, ``array('Q')`` from Python: both are buffers). ``order`` and ``picks``
buffers hold native uint32. A framing fault is ``FramingError`` from Python and
``ValueError(offset, reason)`` from C; ``choice.framing_error`` reads both.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any, Protocol

from prefetchd.kernel.example_encode import FeatureValue

if TYPE_CHECKING:
    from typing_extensions import Buffer

# frame_tar's and check_tar's status (see twin.frame_tar); a status > 0 asks for more bytes
TAR_END, TAR_FALLBACK = 0, -1


class RecordKernel(Protocol):
    """The operations the writer and the downloader's check call, one call per batch."""

    def frame_lines(
        self, buf: bytes, key: bytes, first: int, final: bool, /
    ) -> tuple[bytes, Buffer, int, int]: ...
    def frame_records(self, payloads: list[bytes], /) -> tuple[bytes, Buffer]: ...
    def frame_examples(
        self, samples: list[list[tuple[bytes, FeatureValue]]], /
    ) -> tuple[bytes, Buffer]: ...
    def frame_file_example(
        self, sample: list[tuple[bytes, FeatureValue | None]], fd: int, size: int, /
    ) -> tuple[bytes, Buffer] | None: ...
    def frame_tar(
        self, buf: bytes, final: bool, at_start: bool, /
    ) -> tuple[bytes, Buffer, int, int]: ...
    def check_tar(
        self, buf: bytes, final: bool, at_start: bool, /
    ) -> tuple[int, int, int, int]: ...
    def index_file(self, fd: int, size: int, /) -> bytes: ...
    def check_file(self, fd: int, size: int, /) -> None: ...
    def read_frames(
        self, fd: int, size: int, offsets: bytes, order: bytes, start: int, max_bytes: int, /
    ) -> tuple[bytes, Buffer, int]: ...
    # Any: a part's or a source's ends, which callers hold as memoryview, bytes or array (a
    # list is invariant, so a precise element type would refuse all but one of them)
    def take(
        self, parts: list[tuple[bytes, Any, int, int]], order: bytes, start: int, stop: int, /
    ) -> tuple[bytes, Buffer]: ...
    def interleave(
        self,
        sources: list[tuple[bytes, Any]],
        cursors: array[int],
        picks: bytes,
        start: int,
        limit: int,
        /,
    ) -> tuple[bytes, int]: ...
    def permutation(self, n: int, state: int, /) -> tuple[bytes, int]: ...
    def picks(self, n: int, k: int, state: int, /) -> tuple[bytes, int]: ...
    def source_picks(
        self, groups: bytes, rates: bytes, credits: array[int], k: int, state: int, /
    ) -> tuple[bytes, int]: ...
