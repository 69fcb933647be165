"""Which objects the shard being written holds, step by step: ``Composition``.

The writer notes each step it writes (``step``: the objects it drew from, the seeded draws'
state and the slice of them it used) and, at the commit, turns it into the shard's
``ShardMix`` (``messages/shard_mix.py``), written to ``state_dir/shards/<shard>.mix`` before
the ledger line. A few numbers per step of ~1 MiB: no work per record.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from prefetchd.messages.shard_mix import ShardMix, ShardPart, Step
from prefetchd.write.choices import SourceDraw
from prefetchd.write.objects import OpenObject


class Composition:
    """The shard in progress's objects (``slots``: name -> index, with the record each started
    at) and its steps."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.slots: dict[str, int] = {}
        self.starts: list[int] = []
        self.steps: list[Step] = []

    def step(
        self,
        mixable: Sequence[OpenObject],
        picks: tuple[int, int],
        at: int,
        stop: int,
        draw: SourceDraw | None = None,
    ) -> None:
        """Records ``[at, stop)`` of the draws ``picks`` (``(state, count)``) over ``mixable``
        were written; called before the objects' ``taken`` moves past them. ``draw``: what
        else drew them, if by source (``choices.SourceDraw``)."""
        # looked up in one ``map``: a Python call per open object cost a step of ~7 small
        # records 64 calls; only the objects new to the shard take a few each
        slots = list(map(self.slots.get, [obj.name for obj in mixable], repeat(-1)))
        if -1 in slots:
            for i in [i for i, slot in enumerate(slots) if slot < 0]:
                obj = mixable[i]
                slot = self.slots[obj.name] = len(self.names)
                self.names.append(obj.name)
                self.starts.append(obj.taken)
                slots[i] = slot
        by_source = draw.numbers() if draw is not None else None
        self.steps.append((picks[0], picks[1], at, stop, tuple(slots), by_source))

    def mix(self, open_objects: Sequence[OpenObject], finished: Sequence[OpenObject]) -> ShardMix:
        """The shard's mix at its commit: ``open_objects`` still open, ``finished`` drained."""
        taken = {o.name: o.taken for o in open_objects}
        taken.update((o.name, o.taken) for o in finished)
        last = {o.name for o in finished}
        parts = [
            ShardPart(name, start, taken.get(name, start) - start, name in last)
            for name, start in zip(self.names, self.starts, strict=True)
        ]
        parts += [ShardPart(o.name, o.taken, 0, True) for o in finished if o.name not in self.slots]
        return ShardMix(tuple(parts), tuple(self.steps))
