"""``prefetchd.records()``: the serialized records of this host's shards, without a framework.

Built on ``ready_files()``: each shard is claimed by exactly one caller on the host, read with
the pure-Python TFRecord reader (``prefetchd.tfrecord.iter_records``: big buffered reads, both
CRCs checked) and kept open — so still claimed, and never freed — until its last record has
been yielded. Closing it then lets the shard releaser give its RAM back at once.

Nothing here imports TensorFlow, PyTorch, JAX or numpy: this is the reader for all of them.
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Generator, Iterator, Mapping
from typing import Any, BinaryIO, cast

from prefetchd.config import Config, load_config
from prefetchd.consume.ready import ReadyFiles, ready_files
from prefetchd.consume.releaser import ShardReleaser
from prefetchd.kernel.framing import FramingError, iter_records
from prefetchd.layout import Layout, parse_claim_name


class CorruptShard(ValueError):
    """A shard failed its CRC check or ends inside a frame: the path and the byte offset."""

    def __init__(self, path: str, error: FramingError) -> None:
        super().__init__(f"{path}: {error}")
        self.path = path
        self.offset = error.offset


def records(
    config: str | os.PathLike[str] | Config,
    *,
    epoch: int | None = None,
    timeout: float | None = None,
    position: Mapping[str, Any] | None = None,
) -> Records:
    """Yield the serialized records (``bytes``) of the shards this caller claims.

    Epochs, ``timeout`` and the daemon checks are ``ready_files()``'s: with ``epoch=k`` only
    epoch k, without it every epoch in order; each record reaches exactly one caller on this
    host per epoch. Raises ``CorruptShard`` (a ``ValueError``) on a bad CRC or a truncated
    shard, ``DaemonFailed`` and ``TimeoutError`` as ``ready_files()`` does.

    ``position`` (``{}`` to start, or one saved from ``.position()``) makes the stream
    resumable to the record: see ``Records.position``. A position of another job (dataset,
    seed, host) or of an unknown version raises ``PositionError``.
    """
    cfg = config if isinstance(config, Config) else load_config(config)
    files = ready_files(cfg, epoch=epoch, timeout=timeout, position=position)
    return Records(files, Layout.of(cfg))


def open_shard(path: str) -> BinaryIO:
    """A shard opened for reading; ``.tfrecord.gz`` shards are decompressed as they stream."""
    if path.endswith(".gz"):
        # A GzipFile has every method the reader uses, though typeshed does not call it BinaryIO.
        return cast(BinaryIO, gzip.open(path, "rb"))
    return open(path, "rb")


class Records(Iterator[bytes]):
    """The iterator ``records()`` returns: ``bytes`` records, shard after shard."""

    def __init__(self, files: ReadyFiles, layout: Layout) -> None:
        self._files = files
        self._layout = layout
        self._reading = False  # a shard has records not yielded yet
        self._shard_name = ""  # the shard being read
        self._path = ""  # ... its claimed path
        self._yielded = 0  # records of it handed out (those skipped on resume included)
        self._stream = self._run()

    def __next__(self) -> bytes:
        return next(self._stream)

    def close(self) -> None:
        """Give up the rest of the stream now: the shard being read is closed (and freed, unless
        the stream is resumable) instead of whenever the iterator is collected."""
        self._stream.close()

    def position(self) -> dict[str, Any]:
        """A JSON-able position to save with a checkpoint (streams made with ``position=``).

        It covers every record yielded before the call: the shards whose records have all been
        yielded, and how many of the shard being read. A stream resumed from it delivers every
        other record of the epoch exactly once (the rest of that shard first) and none of
        these. Save it before asking for the next one: this call frees the shards the previous
        position covered.
        """
        records = self._in_progress()
        return self._files.position(unfinished=1 if self._reading else 0, records=records) | {
            "records": records
        }

    def keep_until_freed(self) -> None:
        """From now on keep every shard read (and the one being read) on the RAM disk, also
        past the stream's end, until a saved position covering it is freed (``free_saved``)
        or ``hand_off`` moves it. Idempotent."""
        self._files.start_keeping(self._path if self._reading else None)

    def kept_claims(self) -> list[str]:
        return self._files.kept_claims()

    def hand_off(self, holder: str) -> None:
        self._files.hand_off(holder)

    def snapshot(self) -> dict[str, Any]:
        """``position()``'s position, freeing nothing: the caller frees what a saved one covers
        (``free_saved``); for a DataLoader worker, which snapshots at every batch."""
        unfinished = 1 if self._reading else 0
        return self._files.snapshot(unfinished=unfinished, records=self._in_progress())

    @property
    def ended(self) -> bool:
        """Whether every record of every epoch asked for was yielded."""
        return self._files.ended

    def _in_progress(self) -> dict[str, int]:
        if not self._reading or not self._yielded:
            return {}
        return {self._shard_name: self._yielded}

    def _run(self) -> Generator[bytes, None, None]:
        for path in self._files:
            # ready_files() has its process's releaser; taken now, while claimed/ surely exists.
            releaser = ShardReleaser.for_layout(self._layout)
            try:
                yield from self._shard(path)
            except FramingError as exc:
                raise CorruptShard(path, exc) from None
            finally:
                self._reading = False
                # The shard is closed (read, given up or corrupt): free its RAM now rather than
                # when the releaser's thread next wakes (a forked DataLoader worker may exit
                # before that, without atexit, and the shard would look unread to the daemon).
                releaser.flush()
                # ... and say so: this process opened it and is done with it, the one fact the
                # releaser's open/close events cannot always show (a read faster than its scan)
                releaser.finished(os.path.basename(path))

    def _shard(self, path: str) -> Iterator[bytes]:
        """The records of one shard; it stays open until the last one was yielded.

        One record is read ahead, so ``_reading`` turns false just before the last record of
        the shard is handed out: a position taken then already covers the whole shard.
        """
        claim = parse_claim_name(os.path.basename(path))
        skip = self._files.trained_before(path)
        with open_shard(path) as stream:
            self._shard_name, self._yielded = (claim[1] if claim else ""), skip
            self._path = path
            self._reading = True
            frames = iter_records(stream)
            for _ in range(skip):  # trained before the saved position
                next(frames, None)
            current = next(frames, None)
            while current is not None:
                following, error = _next_or_error(frames)
                if following is None and error is None:
                    self._reading = False
                self._yielded += 1
                yield current  # the records before a corrupt one are still delivered
                if error is not None:
                    raise error
                current = following


def _next_or_error(frames: Iterator[bytes]) -> tuple[bytes | None, FramingError | None]:
    """The next record (None at the end), or the framing error reading it raised."""
    try:
        return next(frames, None), None
    except FramingError as exc:
        return None, exc
