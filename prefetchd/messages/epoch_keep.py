"""Keep figures: ``download.keep``'s hits and misses in one epoch, objects and bytes.

The downloader (``download/keeper.py``) counts them and rewrites ``state_dir/epochs/<k>.keep.json``
atomically when they change; the supervisor reads the last epochs' files into the status
record's ``keep_epochs`` (``supervise/keep_status.py``), where each is one ``EpochKeep``::

    {"version": 1, "epoch": 3, "hits": 120, "hit_bytes": 1258291200, "misses": 8,
     "miss_bytes": 83886080}

In the status record an entry also holds ``hit_ratio``, derived from the bytes.

Other versions (rule: ``prefetchd.messages.wire``): a file without ``version`` is version 0
(written before the figures had a version, and without ``epoch``: the file's name says it).
Unknown fields are ignored, missing ones read as 0.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, Self

from prefetchd.messages.wire import json_object, scalar_fields


def hit_ratio(hit_bytes: int, miss_bytes: int) -> float | None:
    """The share of bytes served from kept copies; None before any object was served."""
    total = hit_bytes + miss_bytes
    return round(hit_bytes / total, 4) if total else None


@dataclass(frozen=True)
class EpochKeep:
    """One epoch's ``download.keep`` hits and misses (objects and bytes)."""

    VERSION: ClassVar[int] = 1

    epoch: int = 0
    hits: int = 0
    hit_bytes: int = 0
    misses: int = 0
    miss_bytes: int = 0
    version: int = VERSION  # of the figures read; ``encode`` writes VERSION

    @property
    def hit_ratio(self) -> float | None:
        """Of the bytes; None before any."""
        return hit_ratio(self.hit_bytes, self.miss_bytes)

    def hit(self, size: int) -> EpochKeep:
        """These figures with one more hit of ``size`` bytes."""
        return replace(self, hits=self.hits + 1, hit_bytes=self.hit_bytes + size)

    def miss(self, size: int) -> EpochKeep:
        """These figures with one more miss of ``size`` bytes."""
        return replace(self, misses=self.misses + 1, miss_bytes=self.miss_bytes + size)

    def encode(self) -> bytes:
        """The one encoder: the JSON object of ``epochs/<k>.keep.json``."""
        return json.dumps({**asdict(self), "version": self.VERSION}).encode()

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """The one decoder; ``MessageError`` if ``data`` holds no JSON object."""
        return cls.decode_object(json_object(data))

    @classmethod
    def decode_object(cls, raw: Any) -> Self:
        """``decode`` of a JSON value already parsed (a status record's entry); a value
        that is no object reads as zeros."""
        return cls(**{"version": 0, **scalar_fields(cls, raw)}) if isinstance(raw, dict) else cls()

    def status_entry(self) -> dict[str, Any]:
        """The entry of the status record's ``keep_epochs``: the figures and ``hit_ratio``."""
        figures = asdict(self)
        del figures["version"]
        return {**figures, "hit_ratio": self.hit_ratio}


def read_epoch_keep(path: Path, epoch: int) -> EpochKeep:
    """Epoch ``epoch``'s figures saved at ``path``; zeros if there are none (or they are
    unreadable)."""
    try:
        figures = EpochKeep.decode(path.read_bytes())
    except (OSError, ValueError):
        return EpochKeep(epoch)
    return replace(figures, epoch=epoch)
