"""The consumer report: a trainer process's wait figures, in ``ram_dir/consumers/<claimant>.lock``.

Written by the trainer (``consume.waits.ConsumerStats``, rewritten in place on every wait and
claim), read by the daemon (``status.read_consumers``) for ``consumer_wait_s`` and the bottleneck
verdict. One JSON object padded with spaces to ``RECORD_SIZE`` bytes, so a reader of the file
(rewritten in place, never truncated) never sees a shorter record's leftovers::

    {"version": 1, "pid": 123, "wait_s": 4.25, "waiting_since": 1700000000.5, "shards": 17,
     "waiting_since_monotonic": 5012.25}

``wait_s`` counts finished waits; ``waiting_since`` (epoch seconds) and
``waiting_since_monotonic`` (time.monotonic(): system-wide, immune to wall-clock steps; what a
reader that knows it uses) are set while the process waits, so the reader adds the wait still
in progress. ``resumed`` (at most ``RESUMED_CHARS`` characters) says where the process resumed
from a saved position, e.g. ``epoch 1: 3 shards done, e00001-w01-0000004.tfrecord from record 17``.

Other versions (rule: ``prefetchd.messages.wire``): trainer and daemon are separate installs (a
sidecar container), so either may be newer. Unknown fields are ignored; missing ones read as 0 /
null. A record without ``version`` is version 0 (the same fields).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import ClassVar, Self

from prefetchd.messages.wire import json_object, scalar_fields

RECORD_SIZE = 256
RESUMED_CHARS = 80


@dataclass(frozen=True)
class ConsumerReport:
    """One trainer process's wait figures, as its lock file holds them."""

    VERSION: ClassVar[int] = 1

    pid: int = 0
    wait_s: float = 0.0
    waiting_since: float | None = None
    shards: int = 0
    version: int = VERSION  # of the report read; ``encode`` writes VERSION
    waiting_since_monotonic: float | None = None
    resumed: str | None = None  # where the process resumed from a saved position, if it did

    def encode(self) -> bytes:
        """The one encoder: exactly ``RECORD_SIZE`` bytes."""
        data = json.dumps({**asdict(self), "version": self.VERSION}).encode()
        if len(data) > RECORD_SIZE:  # four numbers cannot get there; a new field might
            raise ValueError(f"consumer report of {len(data)} bytes > {RECORD_SIZE}")
        return data.ljust(RECORD_SIZE)

    @classmethod
    def decode(cls, data: bytes) -> Self:
        """The one decoder; ``MessageError`` if ``data`` holds no report (empty, torn, not
        JSON), else never raises."""
        return cls(**{"version": 0, **scalar_fields(cls, json_object(data))})
