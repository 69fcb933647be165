"""What one shard holds, object by object: ``ShardMix``, ``state_dir/shards/<shard>.mix``.

A writer writes it (``write/composition.py``) before it commits the shard; a trainer reads it
when a position it saves covers the shard (``consume/stream_position.py``), to keep which of
the source's objects and records it trained (``trained_objects.py``); the supervisor deletes
it once the shard is delivered (a trainer frees a shard only after a position covered it)::

    {"version": 1,
     "objects": [["e00001-000000042-<hash>", 120, 37, false], ...],
     "steps": [[<state>, <count>, <at>, <stop>, [0, 1, 4]],
               [<state>, <count>, <at>, <stop>, [0, 1, 4], [[0, 2, 0], [r0, r1, r2], [c0, c1, c2]]],
               ...]}

``objects``: each object with records in the shard (or drained at it): its local name (its
epoch order's ordinal is in it), the index of its first record here (in the order its records
are taken), how many of its records the shard holds, and whether the last of them is its last.
A writer takes an object's records in order, so the shard holds ``[start, start + count)``.

``steps``: the writer's steps, in shard order, each the records of ``picks`` ``[at, stop)`` of
the seeded draws ``choice.KERNEL.picks(len(slots), count, state)``, pick ``p`` being a record of
object ``slots[p]`` (an index into ``objects``). A step drawn by source (``sources:``,
``write/choices.py``) has a sixth member: each slot's source, the sources' rates and their
credits before the first draw, and its draws are ``choice.KERNEL.source_picks`` of them. So
which object each record of the shard came from costs a few numbers per step of ~1 MiB, not one
per record, and ``trained(k)`` tells how many records of each object the shard's first ``k``
records hold. (A reader of a release before the sixth member refuses such a step as not a
shard's mix rather than count its records wrongly.)

Other versions (rule: ``prefetchd.messages.wire``): unknown fields are ignored; bytes that are
not such an object raise ``MessageError``.
"""

from __future__ import annotations

import json
from array import array
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from prefetchd.kernel import choice
from prefetchd.messages.wire import MessageError, json_object

# a draw by source: each slot's source, the sources' rates, their credits before the draw
BySource = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
Step = tuple[int, int, int, int, tuple[int, ...], BySource | None]  # state, count, at, stop, slots


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
                "steps": [_encode_step(s) for s in self.steps],
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
            steps = tuple(_decode_step(step) for step in raw["steps"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MessageError(f"not a shard's mix: {exc}") from None
        return cls(objects, steps)

    def trained(self, records: int) -> dict[str, int]:
        """How many records of each object (by name) the shard's first ``records`` hold."""
        counts: Counter[int] = Counter()
        left = records
        drawn: dict[tuple[object, ...], Any] = {}
        for state, count, at, stop, slots, by_source in self.steps:
            if left <= 0:
                break
            key = (len(slots), count, state, by_source)
            if key not in drawn:
                drawn[key] = memoryview(_draws(len(slots), count, state, by_source)).cast("I")
            take = min(stop - at, left)
            for pick, n in Counter(drawn[key][at : at + take]).items():
                counts[slots[pick]] += n
            left -= take
        return {self.objects[slot].name: n for slot, n in counts.items()}


def _encode_step(step: Step) -> list[Any]:
    state, count, at, stop, slots, by_source = step
    out: list[Any] = [state, count, at, stop, list(slots)]
    if by_source is not None:
        out.append([list(part) for part in by_source])
    return out


def _decode_step(raw: Any) -> Step:
    state, count, at, stop, slots, *rest = raw
    by_source: BySource | None = None
    if rest:
        (groups, rates, credits), *more = rest
        if more:
            raise ValueError("a step has at most six members")
        by_source = (
            tuple(int(g) for g in groups),
            tuple(int(r) for r in rates),
            tuple(int(c) for c in credits),
        )
    return (int(state), int(count), int(at), int(stop), tuple(int(i) for i in slots), by_source)


def _draws(slots: int, count: int, state: int, by_source: BySource | None) -> bytes:
    """The draws of a step: uniform over ``slots``, or by source."""
    if by_source is None:
        return choice.KERNEL.picks(slots, count, state)[0]
    groups, rates, credits = by_source
    return choice.KERNEL.source_picks(
        array("I", groups).tobytes(), array("Q", rates).tobytes(), array("q", credits), count, state
    )[0]
