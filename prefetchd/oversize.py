"""Records known from the listing to be over ``output.max_record_size``, said before the job starts.

With ``source.format: raw`` an uncompressed object is one record of its own size, so the
listing alone tells which objects a writer will quarantine as ``too_large``. ``prefetchd check``
and the downloader of ``prefetchd run`` (once the share is listed) count them with
``Oversized`` and say how many, which (the first few keys) and what to set: the
``output.max_record_size`` that holds the largest, and the ``output.ram_budget`` that allows it
(``config.record_size_limit`` turned around). Other formats' records are parts of an object,
known only once it is read: those are counted at the end (the job's outcome in status).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefetchd.config import RECORD_OVERHEAD, SMALL_FILES_RESERVE, Config
from prefetchd.logs import escape_key
from prefetchd.sizes import format_size

FIRST_KEYS = 3  # keys named in the message
MIB = 1024**2


def _setting(size: int) -> str:
    """``size`` rounded up to whole MiB, as a value to write in the config."""
    return f"{-(-size // MIB)}MiB"


def _compressed(key: str) -> bool:
    return key.endswith((".gz", ".zst"))


def budget_for(config: Config, record: int) -> int:
    """The smallest ``output.ram_budget`` whose derived record limit holds ``record`` bytes,
    with this config's writers and shard size."""
    out = config.output
    return out.writers * (record + RECORD_OVERHEAD) + out.shard_size + SMALL_FILES_RESERVE


@dataclass
class Oversized:
    """Listed objects whose one record is over the limit: how many, their bytes, the first
    few keys (bounded memory, whatever the listing's length)."""

    config: Config
    source: int = 0  # index into config.sources
    count: int = 0
    total: int = 0
    bytes: int = 0
    largest: int = 0
    first: list[tuple[str, int]] = field(default_factory=list)

    def add(self, key: str, size: int) -> None:
        """Count one listed object of this host's share."""
        self.total += 1
        if self.config.sources[self.source].format != "raw" or _compressed(key):
            return
        if size <= self.config.output.max_record_size:
            return
        self.count += 1
        self.bytes += size
        self.largest = max(self.largest, size)
        if len(self.first) < FIRST_KEYS:
            self.first.append((key, size))

    def message(self) -> str | None:
        """One line saying what will be quarantined and what to set; None if nothing."""
        if not self.count:
            return None
        out = self.config.output
        bucket = self.config.sources[self.source].bucket
        named = ", ".join(
            f"s3://{bucket}/{escape_key(k)} ({format_size(s)})" for k, s in self.first
        )
        more = ", ..." if self.count > len(self.first) else ""
        limit = -(-self.largest // MIB) * MIB  # the setting: whole MiB
        fix = f"set output.max_record_size: {_setting(limit)}"
        need = budget_for(self.config, limit)
        if need > out.ram_budget:
            fix += f" and output.ram_budget: {_setting(need)} or more"
        return (
            f"{self.count} of {self.total} objects ({format_size(self.bytes)}) are over "
            f"output.max_record_size = {format_size(out.max_record_size)} and will be "
            f"quarantined, not delivered: {named}{more}; to deliver them, {fix}"
        )
