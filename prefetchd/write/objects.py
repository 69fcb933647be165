"""A writer's claimed raw objects: opened, read a batch of frames at a time, set aside when bad.

With ``epochs.shuffle``, each open object's records come in a seeded random order: uncompressed
TFRecord objects are shuffled whole by offsets; a ``raw`` object, one record, needs no shuffle
(``formats.one_record``); other objects pass through a block shuffle
(``shuffle.py``) of ``shuffle_bytes(mix)`` each: ``SHUFFLE_BYTES`` shared by the open objects
up to ``mix`` 8, 4 MiB each from there on.

Many open objects mix records better (docs/tuning.md, "Shuffle quality"), so what an open
TFRecord object holds shrinks as ``output.mix`` grows: it is read ``batch_bytes(mix)`` at a time
(``MIX_BATCH_BYTES`` shared by all, at least ``MIN_BATCH_BYTES`` each). A block shuffle's block
does not shrink past 4 MiB: a smaller one copies records more often (a record carried over to
the next block is copied again) and cost the writer 20-30 % more CPU per line at ``mix`` 64
(``bench.profile.writer lines``). Instead a writer opens no further object while its open
objects hold ``MIX_MEMORY`` or more: with formats other than uncompressed TFRecord (about 5 MiB
per open object) that caps the objects open at about a dozen before ``mix`` does.

An object is checked before its first record is taken (``ObjectReader.start``), so a bad one
is quarantined with none of its records in a shard; whatever a parser raises on one object
quarantines that object and nothing else (``quarantine.py``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefetchd.atomic import read_small
from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.layout import Layout, parse_object_name
from prefetchd.logs import escape_key
from prefetchd.messages.counters import QuarantineCounter, WriterCounters
from prefetchd.seeds import object_rng
from prefetchd.spares import SpareGiver
from prefetchd.write.attempts import MAX_ATTEMPTS, ParseAttempts
from prefetchd.write.formats import (
    Format,
    check_object,
    object_frames,
    one_record,
    read_whole_first,
    shuffled_object_frames,
)
from prefetchd.write.formats.plugin import PluginFormat
from prefetchd.write.frames import BATCH_BYTES, EMPTY, Frames, without
from prefetchd.write.quarantine import ParseTimeout, Reason, classify
from prefetchd.write.shuffle import Holding

log = logging.getLogger(__name__)

SHUFFLE_BYTES = 32 * 1024 * 1024
SHUFFLE_RECORDS = 65536
MIX_BATCH_BYTES = 8 * 1024 * 1024  # the batches of a writer's open TFRecord objects, together
MIN_BATCH_BYTES = 128 * 1024  # ... but at least this much each
MIX_MEMORY = 64 * 1024 * 1024  # a writer opens no other object while its open ones hold this


def shuffle_bytes(mix: int) -> int:
    """The block of a block shuffle (formats other than uncompressed TFRecord) with ``mix``
    open objects: ``SHUFFLE_BYTES / mix``, at most 4 MiB from ``mix`` 8 on, at least
    256 KiB."""
    return max(256 * 1024, SHUFFLE_BYTES // min(mix, 8))


def batch_bytes(mix: int) -> int:
    """How much of an uncompressed TFRecord object is read at a time with ``mix`` open: 1 MiB
    (``BATCH_BYTES``) up to ``mix`` 8, then ``MIX_BATCH_BYTES / mix`` down to
    ``MIN_BATCH_BYTES`` (8 MiB per writer up to ``mix`` 64). The records' order does not
    depend on it: the object is shuffled whole, by offsets."""
    return min(BATCH_BYTES, max(MIN_BATCH_BYTES, MIX_BATCH_BYTES // mix))


# what json.loads runs on a meta, less its checks (typeshed does not know the attribute)
_SCAN_JSON: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_NO_BATCHES: Iterator[Frames] = iter(())  # a one-record object's batches after its one

_REASON_COUNTER: dict[Reason, QuarantineCounter] = {
    Reason.CORRUPT: "quarantined_corrupt",
    Reason.TOO_LARGE: "quarantined_too_large",
    Reason.TIMEOUT: "quarantined_timeout",
    Reason.PLUGIN_ERROR: "quarantined_plugin_error",
}


@dataclass(eq=False)  # compared by identity: the mixer removes one from a list of many
class OpenObject:
    """A claimed raw object and how many of its records are already taken."""

    name: str
    key: str
    epoch: int
    path: str | Path  # the claimed file (the writer's own: a str, a Path costs ~15 calls)
    batches: Iterator[Frames]
    frames: Frames = EMPTY  # the current batch; frames[cursor:] are still to be written
    cursor: int = 0
    taken: int = 0
    holding: Holding = field(default_factory=Holding)  # what ``batches`` keeps besides frames
    waiting: bool = False  # its batch ran out while another object was holding a large one
    started: bool = True  # False: reopened after a restart, not yet read up to ``taken``
    meta: dict[str, object] = field(default_factory=dict)  # the downloader's meta of it
    source: int = 0  # index into config.sources (its meta's "source")
    measured: int = 0  # ``held()`` when the mixer last looked (after it changed the batch)
    measured_frames: int = 0  # ... and the frames and bytes of the batch then
    measured_bytes: int = 0
    seen_records: int = 0  # records and frame bytes of the batches it gave the mixer so far
    seen_bytes: int = 0  # (the mixer's records per byte of its source: mixing.SourceRates)
    # A one-record object's lane (``ObjectReader.open``): its format's ``one_frame``, which
    # ``start`` takes its one batch from; ``batches`` is then empty.
    one_frame: Callable[[str, str | Path], Frames] | None = None
    meta_path: str = ""  # its meta's file, as ``open`` read it ("": unknown, ``delete`` joins it)

    def held(self) -> int:
        """The bytes this object keeps in memory: its current batch and its iterator's."""
        return len(self.frames.data) + self.holding.bytes


class ObjectReader:
    """Turns writer ``i``'s claimed objects into batches of frames, and removes them.

    Owns the input format, the per-object shuffle's bound (``shuffle_bytes``), the note of
    plugin reads that hung (``attempts.py``) and the local files of a claimed object: its meta
    and its bytes (``delete``). ``quarantine`` logs and counts an object set aside for good."""

    def __init__(
        self,
        ctx: ChildContext,
        counters: WriterCounters,
        formats: Sequence[Format],
        layout: Layout,
        index: int,
        claimed: Callable[[str], str],
        report: Callable[[], None],
    ) -> None:
        self.ctx = ctx
        self.config: Config = ctx.config
        self.counters = counters
        self.formats = formats  # one per source (config.sources)
        self.layout = layout
        self.claimed = claimed
        self.report = report  # called while a large object is checked: stay visibly alive
        self.shuffle_bytes = shuffle_bytes(self.config.output.mix)
        # per source: its format's ``one_frame`` if it has one (``raw``), for the lane of
        # one-record objects (``open``)
        self.one_frame: list[Callable[[str, str | Path], Frames] | None] = [
            getattr(fmt, "one_frame", None) for fmt in formats
        ]
        self.attempts = ParseAttempts(layout.parse_attempts_file(index))
        # A finished object's files become spares for the downloader's next ones (spares.py);
        # with download.keep its bytes may be hard-linked into keep/: those are deleted.
        self.spares = SpareGiver(layout.cache_tmp, index, enabled=not self.config.download.keep)

    def open(self, name: str, *, resume_at: int) -> OpenObject:
        """The claimed object ``name``, its first ``resume_at`` records already taken; not
        read yet (``start``)."""
        path = self.claimed(name)
        meta_path = self.layout.meta_file(name)
        parsed = parse_object_name(name)
        assert parsed is not None
        try:
            # decoded here: json.loads of bytes first guesses their encoding in Python, and
            # a meta is the downloader's json.dumps, ASCII (UnicodeDecodeError is a ValueError)
            text = read_small(meta_path).decode()
            try:  # json.loads' own scanner, called straight: 2 calls where loads makes 10
                meta, end = _SCAN_JSON(text, 0)
            except StopIteration:  # not JSON at its first character
                end = -1
            if end != len(text):  # whitespace around it, or not JSON: as json.loads has it
                meta = json.loads(text)
            key = meta["key"]
        except (OSError, ValueError, KeyError, TypeError):
            meta, key = {}, f"<unknown key of {name}>"
        source = meta.get("source", 0)
        if not isinstance(source, int) or not 0 <= source < len(self.formats):
            source = 0
        fmt = self.formats[source]
        skip = meta.get("skip")
        one_frame = self.one_frame[source]
        if one_frame is not None and resume_at == 0 and not (isinstance(skip, list) and skip):
            # the lane of a one-record object (``raw``): no seed, no shuffle, no generator;
            # ``start`` takes its one batch in one call (``RawFormat.one_frame``)
            obj = OpenObject(name, key, parsed[0], path, _NO_BATCHES, one_frame=one_frame)
            obj.meta, obj.source, obj.meta_path = meta, source, meta_path
            return obj
        holding = Holding()
        if self.config.epochs.shuffle and not one_record(fmt):
            batches = shuffled_object_frames(
                fmt,
                key,
                path,
                object_rng(self.config.epochs.seed, parsed[0], key).getrandbits(64),
                max_records=SHUFFLE_RECORDS,
                max_bytes=self.shuffle_bytes,
                holding=holding,
            )
        else:
            batches = object_frames(fmt, key, path)
        if isinstance(skip, list) and skip:
            # resumed on another number of hosts: these records were trained before
            batches = without(batches, skip)
        obj = OpenObject(name, key, parsed[0], path, batches, taken=resume_at, holding=holding)
        obj.meta, obj.source, obj.meta_path = meta, source, meta_path
        return obj

    def start(self, obj: OpenObject) -> None:
        """Read ``obj`` through first if it needs it (``_validate``), then up to its first
        record not yet taken (``obj.taken``, from the journal). Raises what parsing raises."""
        resume_at, obj.taken, obj.started = obj.taken, 0, True
        if obj.one_frame is not None:  # a one-record object, from its start (``open``)
            obj.frames = obj.one_frame(obj.key, obj.path)  # whole or raised: nothing to check
            return
        if resume_at == 0 and not self._checked_whole(obj):
            self._validate(obj)
        self.skip(obj, resume_at)  # which also reads the first batch

    def _checked_whole(self, obj: OpenObject) -> bool:
        """Whether the object is known good before its first record is taken, so reading it
        through first (``_validate``) would only repeat work: the format checks all of it first,
        or the downloader found every TFRecord frame's CRCs right (``records_ok`` in its meta:
        uncompressed ``tfrecord`` input, whose bytes went from its check into the cache file and
        never left this host) and the object is too small to hold a record over
        ``output.max_record_size``."""
        if obj.meta.get("records_ok") is True:
            with contextlib.suppress(OSError):
                if os.stat(obj.path).st_size <= self.config.output.max_record_size:
                    return True
        return read_whole_first(self.formats[obj.source], obj.key, str(obj.path))

    def _validate(self, obj: OpenObject) -> None:
        """Parse the whole object once, keeping nothing, before any of its records is taken:
        a bad object is then quarantined with none of its records in a shard (see "Hostile
        input" in docs/reliability.md). Raises what the format raises; with a plugin, also
        ``ParseTimeout`` once ``MAX_ATTEMPTS`` reads of this object hung until the writer was
        killed (``attempts.py``)."""
        fmt, src = self.formats[obj.source], self.config.sources[obj.source]
        plugin = isinstance(fmt, PluginFormat)
        if plugin and self.attempts.begin(obj.name) >= MAX_ATTEMPTS:
            self.attempts.end(obj.name)
            raise ParseTimeout(obj.key, src.format, src.parse_timeout, killed=MAX_ATTEMPTS)
        try:
            for _ in check_object(fmt, obj.key, str(obj.path)):
                self.report()  # a large object takes a while: stay visibly alive
        finally:
            if plugin:
                self.attempts.end(obj.name)

    @staticmethod
    def skip(obj: OpenObject, count: int) -> None:
        """Pass over the first ``count`` records (those the journal says are in shards) and
        stop in the batch that holds the next one."""
        for frames in obj.batches:
            if count - obj.taken < len(frames):
                obj.frames, obj.cursor = frames, count - obj.taken
                obj.taken = count
                return
            obj.taken += len(frames)

    def tombstone(self, name: str) -> bool:
        """Whether the claimed ``name`` stands for an object the downloader skipped (in the
        replayable order it publishes an empty file whose meta says so: write/replay.py)."""
        try:
            meta = json.loads(read_small(self.layout.meta_file(name)))
        except (OSError, ValueError):
            return False
        return isinstance(meta, dict) and meta.get("skipped") is True

    def quarantine(self, obj: OpenObject, exc: Exception) -> None:
        """Set ``obj`` aside for good: deleted at once (so a restart cannot count it again),
        logged once with its key and the reason, counted under its ``Reason``."""
        reason, message = classify(exc)
        try:
            size = os.stat(self.claimed(obj.name)).st_size
        except OSError:
            size = 0
        self.delete(obj.name)
        log.error(
            "quarantined s3://%s/%s (%s): %s",
            self.config.sources[obj.source].bucket,
            escape_key(obj.key),
            reason.value,
            escape_key(message),
        )
        self.ctx.error(obj.key, message)
        self.counters["errors"] += 1
        self.counters["objects_consumed"] += 1
        self.counters["objects_quarantined"] += 1
        self.counters["bytes_quarantined"] += size
        self.counters[_REASON_COUNTER[reason]] += 1

    def delete(self, name: str, meta_path: str = "") -> None:
        """Remove a claimed object's meta (at ``meta_path`` if given: ``OpenObject.meta_path``,
        not joined again per object), then its bytes (a meta whose object is gone then always
        means the object vanished): each emptied and left to the downloader as a spare
        (``spares.py``), or deleted."""
        for path in (meta_path or self.layout.meta_file(name), self.claimed(name)):
            self.spares.give(path)
