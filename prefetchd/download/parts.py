"""How an object is cut into ranged GETs (pure): what decides whether objects complete early and
in the epoch's order, or many at once and late together."""

from __future__ import annotations

MIN_OBJECT_PART = 2 * 1024**2  # finer parts spend more of their time waiting than moving


def object_part_size(size: int, part_size: int, concurrency: int) -> int:
    """The ranged-GET size for an object of ``size`` bytes: fine enough that its parts can take
    every one of ``concurrency`` connections, so objects complete one after another in order
    (what the writers and the trainer wait for) rather than many dividing the connections and
    finishing late together; never finer than ``MIN_OBJECT_PART`` (each part pays a request's
    first-byte latency) nor coarser than ``part_size`` (``download.part_size``)."""
    wanted = max(MIN_OBJECT_PART, -(-size // max(1, concurrency)))
    return min(part_size, wanted)


def slots_for(size: int, part: int, concurrency: int) -> int:
    """Connections an object of ``size`` bytes in parts of ``part`` bytes can use at once."""
    return max(1, min(concurrency, -(-size // part)))
