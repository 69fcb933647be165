"""Where a training run stands in prefetchd's stream, to the record: ``TrainingPosition``.

A position saved by ``ready_files(...).position()`` counts whole shards handed out. A
``tf.data`` pipeline reads ahead of the model (interleave, batch, prefetch), so a shard handed
out is not yet trained on; covering it in a checkpoint would lose its unread records after a
crash. ``TrainingPosition`` therefore counts what the model *finished*: the trainer reports
trained records (``trained(n)``, after each step), and the position it returns covers only the
shards whose records were all trained, plus, for the one shard being trained, how many of its
records (in file order) to skip when it comes back. Shards are read one after the other in the
order they were handed out, so "the first n records handed out" is well defined.

Saved form (JSON), a ``ready_files`` position with one more key::

    {"version": 1, "epoch": 1, "consumed": ["e000001-w00-c000003.tfrecord", ...],
     "records": {"e000001-w00-c000004.tfrecord": 17}}

Resumed from it, a trainer gets every record of this host's share of the epoch that the saved
run had not trained on, exactly once, and none it had (see docs/keras.md for the bound when the
model checkpoint and the position are not saved at the same step).

This module imports no framework; ``prefetchd.tf`` and ``prefetchd.keras`` build on it.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.consume.position_format import check_job, job_for
from prefetchd.consume.ready import ReadyFiles, ready_files
from prefetchd.consume.stream_position import parse_position
from prefetchd.kernel.framing import index_records
from prefetchd.layout import claimed_shard, parse_shard_name
from prefetchd.tfrecord import read_records

log = logging.getLogger(__name__)


def count_records(path: str) -> int:
    """How many records the TFRecord shard at ``path`` holds (``.gz``: gzip-compressed)."""
    if path.endswith(".gz"):
        count = 0
        with gzip.open(path, "rb") as stream:
            for _ in read_records(stream):  # type: ignore[arg-type]
                count += 1
        return count
    fd = os.open(path, os.O_RDONLY)
    try:
        return len(index_records(fd, os.fstat(fd).st_size))
    finally:
        os.close(fd)


def parse_training_position(raw: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """Split a saved position into its ``ready_files`` part and its per-shard record counts;
    raises ``ValueError`` naming what is wrong."""
    base = {k: v for k, v in raw.items() if k != "records"}
    parse_position(base)
    records = raw.get("records", {})
    if not isinstance(records, Mapping) or not all(
        isinstance(name, str)
        and parse_shard_name(name) is not None
        and isinstance(n, int)
        and not isinstance(n, bool)
        and n >= 0
        for name, n in records.items()
    ):
        raise ValueError("position: records must map shard names to record counts")
    return base, dict(records)


@dataclass
class _Shard:
    """A shard handed to the pipeline: its name, records in it, records trained so far."""

    name: str
    total: int
    done: int


class TrainingPosition:
    """The trainer's place in the stream, counted in records the model finished.

    Use one per training run: ``files(config, epoch)`` for each epoch's pipeline (in epoch
    order), ``trained(n)`` after every step with the number of records it trained on,
    ``epoch_done(k)`` once epoch k was trained to its end, and ``to_json()`` to save with the
    model's checkpoint (then save the model first: see docs/keras.md).
    """

    def __init__(self, saved: Mapping[str, Any] | None = None) -> None:
        base, records = parse_training_position(saved or {})
        self._base = parse_position(base).to_json()
        self._skip = records  # shard -> records trained before the saved position
        self._stream: ReadyFiles | None = None
        self._exhausted = False  # whether _stream ended (its epoch has nothing more)
        self._reading: deque[_Shard] = deque()  # handed out, not all trained, in order
        self._ended: list[ReadyFiles] = []  # streams of epochs trained since the last save
        self._ended_saved: list[ReadyFiles] = []  # ... and of those before it
        self._finished = 0  # shards all trained since the last position (_stream's order)
        # files() runs in tf.data's thread, trained() and to_json() in the trainer's.
        self._lock = threading.Lock()

    def check(self, config: Config) -> None:
        """Raise ``PositionError`` (one line) if this position was saved by another job (another
        dataset, ``epochs.seed`` or host): at once, not from inside the trainer's pipeline."""
        check_job(self._base, job_for(config))

    @property
    def epoch(self) -> int:
        """The first epoch this position may still have to deliver records of."""
        return int(self._base["epoch"])

    def files(
        self, config: Config, epoch: int, *, timeout: float | None = None
    ) -> Iterator[tuple[str, int]]:
        """Epoch ``epoch``'s shards as ``(path, records to skip)``, resuming from this position.

        Epochs before ``epoch`` that the position has not finished are taken as trained
        (the model's checkpoint says it is at ``epoch``): their returned shards are freed.
        An epoch before the position's ``epoch`` gives nothing: this trainer's stream of it
        had ended when the position was saved (under a multi-worker strategy the workers still
        step through its end together: docs/multi-worker.md).
        """
        if epoch < self.epoch:
            self._exhausted = True
            return
        self._finish_earlier(config, epoch)
        stream = ready_files(config, epoch=epoch, timeout=timeout, position=self._base)
        stream.keep_at_end = True  # the pipeline still reads the last shards when it ends
        if self._stream is not None:
            self._abandon(self._stream)
        self._stream = stream
        self._exhausted = False
        self._finished = 0
        for path in stream:
            name = claimed_shard(os.path.basename(path))
            total = count_records(path)
            with self._lock:
                skip = self._skip.pop(name, 0)
                self._reading.append(_Shard(name, total, skip))
            yield path, skip
        self._exhausted = True

    def trained(self, records: int) -> None:
        """The model finished ``records`` more records (in the order they were handed out)."""
        with self._lock:
            while records > 0 and self._reading:
                head = self._reading[0]
                step = min(records, head.total - head.done)
                head.done += step
                records -= step
                self._drop_empty()

    def epoch_done(self, epoch: int) -> None:
        """Every record of ``epoch`` was trained on: the position moves to the next epoch.

        Raises ``RuntimeError`` if the epoch's stream had not ended: the trainer stopped the
        epoch early (e.g. a fixed ``steps_per_epoch``) and its other records would be lost.
        """
        if self._stream is not None and not self._exhausted:
            raise RuntimeError(
                f"epoch {epoch} was ended before its last record: train each prefetchd epoch "
                "to its end (no steps_per_epoch); its other records would never be trained"
            )
        # Its shards stay on the RAM disk until a position past the epoch was certainly saved
        # (the one after the next): the model's checkpoint may still be from inside it.
        if self._stream is not None:
            self._ended.append(self._stream)
        self._stream = None
        with self._lock:
            self._reading.clear()
            self._finished = 0
        self._skip = {n: k for n, k in self._skip.items() if _epoch_of(n) > epoch}
        if epoch >= self.epoch:  # not an epoch the position was already past
            self._base = {"version": self._base["version"], "epoch": epoch + 1, "consumed": []}

    @property
    def reading(self) -> bool:
        """Whether an epoch's stream is open and has not ended yet."""
        return self._stream is not None and not self._exhausted

    def finish(self) -> None:
        """Training is over: free every shard still kept for a restart. Shards of an epoch
        stopped early that were not all trained go back to ``ready/`` instead."""
        if self._stream is not None and not self._exhausted:
            self._abandon(self._stream)
            self._stream = None
        for stream in [*self._ended_saved, *self._ended, *filter(None, [self._stream])]:
            stream.release()
        self._ended_saved, self._ended, self._stream = [], [], None
        with self._lock:
            self._reading.clear()
            self._finished = 0

    def to_json(self) -> dict[str, Any]:
        """The position to save now: JSON-able, small (one entry per shard in flight)."""
        for stream in self._ended_saved:
            stream.release()
        self._ended_saved, self._ended = self._ended, []
        with self._lock:
            self._drop_empty()
            finished, self._finished = self._finished, 0
            records = dict(self._skip)
            records.update((s.name, s.done) for s in self._reading if s.done)
        if self._stream is not None:
            # records too: the objects a position keeps count the shards in progress' as well
            self._base = self._stream.position(finished=finished, records=records)
        return {**self._base, "records": records}

    def save(self, path: str | os.PathLike[str], *, free_past_epochs: bool = True) -> None:
        """Write ``to_json()`` to ``path`` atomically (durable before it returns), creating
        its directory if the model's checkpoint has not made it yet.

        Saved, the epochs it moved past need their shards no longer (the model's checkpoint,
        saved first, is past them too), so they are freed. With ``free_past_epochs=False`` they
        stay until the next save or ``finish()``: under a multi-worker strategy a worker may
        have to resume from its previous position, because another worker died before it saved
        this step (docs/multi-worker.md); call ``free_past_epochs()`` once every worker saved.
        """
        data = json.dumps(self.to_json(), sort_keys=True).encode()
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_atomic(Path(path), data, fsync=True)
        if free_past_epochs:
            self.free_past_epochs()

    def free_past_epochs(self) -> None:
        """Free the shards of the epochs the last saved position moved past (``save`` does
        this itself unless told not to)."""
        for stream in self._ended_saved:
            stream.release()
        self._ended_saved = []

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TrainingPosition:
        """The position saved at ``path``, or the start if there is none yet."""
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return cls()
        except ValueError as exc:
            raise ValueError(f"{path}: not a saved prefetchd position: {exc}") from None
        try:
            return cls(raw)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None

    def _abandon(self, stream: ReadyFiles) -> None:
        """An iteration given up before its epoch's end (Keras draws one batch from a throwaway
        iterator to build a distributed model): what it trained stays covered, its unfinished
        shards go back to ``ready/`` for the next iteration, skipping what was trained."""
        with self._lock:
            self._drop_empty()
            finished, self._finished = self._finished, 0
            self._skip.update((s.name, s.done) for s in self._reading if s.done)
            self._reading.clear()
        self._base = stream.position(finished=finished)
        stream.give_back()
        self._ended.append(stream)

    def _drop_empty(self) -> None:
        """Shards at the head with nothing left to train are finished (called with _lock)."""
        while self._reading and self._reading[0].done >= self._reading[0].total:
            self._reading.popleft()
            self._finished += 1

    def _finish_earlier(self, config: Config, epoch: int) -> None:
        """Consume what is left of epochs before ``epoch``: the model already trained them."""
        for earlier in range(self.epoch, epoch):
            for _ in ready_files(config, epoch=earlier, position=self._base):
                pass  # returned shards of a trained epoch: the exhausted stream frees them
            self.epoch_done(earlier)


def _epoch_of(name: str) -> int:
    parsed = parse_shard_name(name)
    return parsed.epoch if parsed is not None else -1
