"""What one shard holds, object by object: ``ShardMix``, ``state_dir/shards/<shard>.mix``.

A writer writes it (``write/composition.py``) before it commits the shard; a trainer reads it
when a position it saves covers the shard (``consume/stream_position.py``), to keep which of
the source's objects and records it trained (``trained_objects.py``); the supervisor deletes
it once the shard is delivered (a trainer frees a shard only after a position covered it)::

    {"version": 1,
     "objects": [["e00001-000000042-<hash>", 120, 37, false], ...],
     "steps": [[<state>, <count>, <at>, <stop>, [0, 1, 4]], ...]}

``objects``: each object with records in the shard (or drained at it): its local name (its
epoch order's ordinal is in it), the index of its first record here (in the order its records
are taken), how many of its records the shard holds, and whether the last of them is its last.
A writer takes an object's records in order, so the shard holds ``[start, start + count)``.

``steps``: the writer's steps, in shard order, each the records of ``picks`` ``[at, stop)`` of
the seeded draws ``choice.KERNEL.picks(len(slots), count, state)``, pick ``p`` being a record of
object ``slots[p]`` (an index into ``objects``). So which object each record of the shard came
from costs a few numbers per step of ~1 MiB, not one per record, and ``trained(k)`` tells how
many records of each object the shard's first ``k`` records hold.

Other versions (rule: ``prefetchd.messages.wire``): unknown fields are ignored; bytes that are
not such an object raise ``MessageError``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from prefetchd.kernel import choice
from prefetchd.messages.wire import MessageError, json_object

Step = tuple[int, int, int, int, tuple[int, ...]]  # state, count, at, stop, slots


@dataclass(frozen=True)
class ShardPart:
    """One object's records in a shard: ``[start, start + count)``; ``last``: its last too."""

    name: str
    start: int
    count: int
    last: bool


@dataclass(frozen=True)
class ShardMix:
    """Which objects a shard's records came from, record by record (see the module)."""

    VERSION: ClassVar[int] = 1

    objects: tuple[ShardPart, ...]
    steps: tuple[Step, ...]

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": self.VERSION,
                "objects": [[p.name, p.start, p.count, p.last] for p in self.objects],
                "steps": [[s[0], s[1], s[2], s[3], list(s[4])] for s in self.steps],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Self:
        raw = json_object(data)
        try:
            objects = tuple(
                ShardPart(str(n), int(a), int(c), bool(last)) for n, a, c, last in raw["objects"]
            )
            steps = tuple(
                (int(s), int(c), int(a), int(b), tuple(int(i) for i in slots))
                for s, c, a, b, slots in raw["steps"]
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"not a shard's mix: {exc}") from None
        return cls(objects, steps)

    def trained(self, records: int) -> dict[str, int]:
        """How many records of each object (by name) the shard's first ``records`` hold."""
        counts: Counter[int] = Counter()
        left = records
        drawn: dict[tuple[int, int, int], Any] = {}
        for state, count, at, stop, slots in self.steps:
            if left <= 0:
                break
            key = (len(slots), count, state)
            if key not in drawn:
                drawn[key] = memoryview(choice.KERNEL.picks(len(slots), count, state)[0]).cast("I")
            take = min(stop - at, left)
            for pick, n in Counter(drawn[key][at : at + take]).items():
                counts[slots[pick]] += n
            left -= take
        return {self.objects[slot].name: n for slot, n in counts.items()}
