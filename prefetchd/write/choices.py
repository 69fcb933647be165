"""The seeded choices of object a writer's mixer draws its records by: ``Choices``.

With one source, each next record comes from an open object chosen uniformly
(``choice.KERNEL.picks``). With several sources (``sources:``) and objects of two or more of
them open, each next record's source is chosen first, by smooth weighted round robin at the
rate that source's records arrive (``source_rates.py``; ``choice.KERNEL.source_picks``), then
its object uniformly among that source's open objects. A uniform draw across objects gives a
source the share of the open objects it happens to hold, which drifts over an object's lifetime
(thousands of records): with one writer, windows of 1,000 records were 13.7 points off the
epoch's shares, 1.3-1.5 with the draw by source (tests/e2e/test_mixed_sources.py;
``bench.studies.mix_windows``, docs/sources.md). A source with no object open is left out of
the round (nothing is owed to it later: no burst when one opens); with one source open, the
draw is the uniform one.

Choices are drawn ``PICKS`` at a time, but no more than the mixable objects' current batches
can use: when the set of mixable objects changes the rest is thrown away (``discard``), the
round robin's credits first brought to where the choices used leave them.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import NamedTuple

from prefetchd.kernel import choice
from prefetchd.seeds import mixing_rng
from prefetchd.write.objects import OpenObject
from prefetchd.write.source_rates import SourceRates

PICKS = 16384  # choices of object drawn at once


class SourceDraw(NamedTuple):
    """What, besides the generator's state and count, drew choices by source: each mixable
    object's source (``groups``, uint32), the sources' rates (uint64) and their credits before
    the first choice (``choice.KERNEL.source_picks``)."""

    groups: bytes
    rates: bytes
    credits: tuple[int, ...]

    def numbers(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The same as integers (a shard's mix keeps them: ``messages/shard_mix.py``)."""
        return tuple(array("I", self.groups)), tuple(array("Q", self.rates)), self.credits


class Choices:
    """A writer's seeded choices among its mixable objects.

    Owns the generator's state (``mix_state``, seeded per epoch and writer: ``mix_epoch``), the
    choices drawn ahead (``picks`` from ``pick_at`` on, uint32 indices into the mixable list)
    and what drew them (``picks_from``: the state and count; ``draw_from``: the draw by source,
    None for a uniform one), and with several sources the round robin's ``credits`` and the
    rate estimates (``rates``). ``by_source=False`` draws uniformly across objects whatever
    their sources (``bench.studies.mix_windows``)."""

    def __init__(self, seed: int, index: int, *, by_source: bool = True) -> None:
        self.seed = seed
        self.index = index
        self.by_source = by_source
        self.rates = SourceRates()
        self.credits = array("q")  # per source: its credit in the draw by source
        self.mix_epoch: int | None = None  # the epoch mix_state was seeded for
        self.mix_state = 0  # SplitMix64 state of the choices of object
        self.picks = b""  # choices of object drawn ahead: uint32 indices into mixable()
        self.pick_at = 0
        self.picks_from: tuple[int, int] | None = None  # (state, count) that drew ``picks``
        self.draw_from: SourceDraw | None = None  # with ``picks_from``, what drew ``picks``

    def seed_epoch(self, epoch: int) -> None:
        """The mixable objects are of ``epoch`` now: seed its choices (once per epoch)."""
        if epoch != self.mix_epoch:
            self.mix_epoch = epoch
            self.mix_state = mixing_rng(self.seed, epoch, self.index).getrandbits(64)
            self.picks, self.draw_from, self.credits = b"", None, array("q")
            self.rates.forget_before(epoch)

    def discard(self) -> None:
        """The set of objects to choose from changed: the choices drawn ahead are thrown away
        (the credits of a draw by source first brought to where the choices used leave them)."""
        if self.draw_from is not None and self.picks_from is not None and self.picks:
            self._settle(self.draw_from, self.picks_from[0])
        self.picks = b""
        self.picks_from = None
        self.draw_from = None

    def _settle(self, draw: SourceDraw, state: int) -> None:
        """The credits and the generator's state after the first ``pick_at`` choices of
        ``draw``: as if only those had been drawn, so the round robin goes on evenly across a
        change of the open objects (which throws the rest away)."""
        credits = array("q", draw.credits)
        _, self.mix_state = choice.KERNEL.source_picks(
            draw.groups, draw.rates, credits, self.pick_at, state
        )
        self.credits = credits

    def ready(self, mixable: list[OpenObject]) -> bytes:
        """The choices, drawn ahead if those left are used up (``pick_at`` is the next)."""
        if self.pick_at * 4 >= len(self.picks):
            self.draw_ahead(mixable)
        return self.picks

    def draw_ahead(self, mixable: list[OpenObject]) -> None:
        """Draw the next choices of object: no more than can be used before some object's
        batch runs out (then the set may change and the rest would be thrown away)."""
        # a constant number of calls, not two per open object (a generator's resumption and
        # ``len``): with 64 small objects open a step takes ~7 records, so a per-object call
        # here cost each of them ~18 (``test_writer_batches``)
        left = sum(map(len, [o.frames.ends for o in mixable])) - sum([o.cursor for o in mixable])
        count = min(PICKS, left + 1)
        self.picks_from = (self.mix_state, count)
        draw = self.source_draw(mixable)
        if draw is None:
            self.picks, self.mix_state = choice.KERNEL.picks(len(mixable), count, self.mix_state)
        else:
            self.picks, self.mix_state = choice.KERNEL.source_picks(
                draw.groups, draw.rates, self.credits, count, self.mix_state
            )
        self.draw_from = draw
        self.pick_at = 0

    def source_draw(self, mixable: Sequence[OpenObject]) -> SourceDraw | None:
        """How to draw by source from ``mixable``: None (uniformly across objects) with one
        source open, ``by_source`` off, or a source without an estimate yet."""
        if not self.by_source or len(self.rates.seen_records) < 2:
            return None  # one source so far: not a step more than before sources existed
        groups = array("I", [o.source for o in mixable])
        first = groups[0]
        if all(g == first for g in groups):
            return None
        rates = self.rates.rates(mixable[0].epoch, groups)
        if rates is None:
            return None
        sources = len(rates) // 8
        if len(self.credits) < sources:
            self.credits.extend([0] * (sources - len(self.credits)))
        # one rate per credit (the kernel's contract); a source not open keeps its credit
        rates += bytes(8 * (len(self.credits) - sources))
        return SourceDraw(groups.tobytes(), rates, tuple(self.credits))

    def state(self, open_objects: list[OpenObject]) -> dict[str, object]:
        """The seeded state of the choices, at a commit: what ``restore`` needs to go on as if
        nothing happened (with the same objects open, each at its position)."""
        draw = self.draw_from.numbers() if self.picks and self.draw_from else None
        return {
            "epoch": self.mix_epoch,
            "state": self.mix_state,
            "picks": list(self.picks_from) if self.picks and self.picks_from else None,
            "at": self.pick_at,
            "credits": list(self.credits),
            "draw": [list(part) for part in draw] if draw else None,
            "rates": self.rates.state(open_objects) if self.by_source else None,
        }

    def restore(
        self,
        saved: dict[str, object],
        open_objects: list[OpenObject],
        mixable: Callable[[], list[OpenObject]],
    ) -> None:
        """Put back what ``state`` saved, once the same objects are open again."""
        epoch, state, picks, at = saved["epoch"], saved["state"], saved["picks"], saved["at"]
        self.mix_epoch = epoch if isinstance(epoch, int) else None
        self.mix_state = int(str(state))
        credits, draw = saved.get("credits"), saved.get("draw")
        self.credits = array("q", [int(c) for c in credits] if isinstance(credits, list) else [])
        self.rates.restore(saved.get("rates"), open_objects)
        if open_objects and isinstance(picks, list) and len(picks) == 2:
            count_of = len(mixable())
            start, count = int(picks[0]), int(picks[1])
            if isinstance(draw, list) and len(draw) == 3:
                groups, rates, before = (list(map(int, part)) for part in draw)
                self.draw_from = SourceDraw(
                    array("I", groups).tobytes(), array("Q", rates).tobytes(), tuple(before)
                )
                self.credits = array("q", before)
                self.picks, self.mix_state = choice.KERNEL.source_picks(
                    self.draw_from.groups, self.draw_from.rates, self.credits, count, start
                )
            else:
                self.picks, self.mix_state = choice.KERNEL.picks(count_of, count, start)
            self.picks_from = (start, count)
            self.pick_at = int(str(at))
