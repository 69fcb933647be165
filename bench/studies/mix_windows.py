"""How evenly the writers interleave several sources: the worst window of records, off the daemon.

Issue 26's local bar: any window of 1,000 (and 10,000) consecutive records a trainer reads holds
each source within a few points of its share of the epoch. This study drives the real
``write.mixing.Mixer`` (its seeded draws, in the C kernel or the twin) with synthetic objects of
``tests/e2e/test_mixed_sources.py``'s shape, in the real download order
(``download.mixture.epoch_mix``), and measures, for each source, the largest difference between
its share of a window and its share of the epoch. One thing varies at a time:

- ``--draw``: ``source`` (the writers' draw: each record's source by its deficit against the
  sources' record shares, then uniformly among that source's open objects; ``Mixer``'s
  default), ``uniform`` (uniformly across the open objects, what writers did before: the
  ``Mixer`` with ``by_source=False``), ``weighted`` (each record's source drawn at random with
  the same shares, no deficit: the draw that was tried in the kernel and measured no better);
- ``--split``: ``balanced`` (the download order as planned: each source's objects dealt
  evenly to the writers' turns, ``seq % writers``) or ``merged`` (as merged, before that
  balance: which writer gets which object of a source is chance);
- ``--mix`` (``output.mix``), ``--writers`` and how the trainer reads their shards
  (``--shard-records``: one writer's shard after another, in the order they are published);
- ``--records``: each source's records per object (``web=20-40,code=1,books=10-30``);
- ``--supply``: the downloader's pace as a multiple of what the writers take (``inf``: ready/
  always holds objects; below 1 the writers find ready/ empty and draw from fewer objects);
- ``--scale``: objects per source, as a multiple of the test's (the epoch's length).

Besides the windows it prints ``writers``: the range of the writers' own shares of the first
source over the epoch (each writer takes objects ``seq % writers`` of the download order, which
need not split each source evenly), and ``alone``: the worst 1,000-record window of a writer's
own records against its own shares.

    python -m bench.studies.mix_windows                       # the draws, the test's shape
    python -m bench.studies.mix_windows --draw source --split merged --split balanced \
        --writers 1 --writers 2 --writers 4 --scale 4         # what the writers' split does

Everything is seeded (``--seed``): a rerun prints the same numbers.
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prefetchd.download.mixture import REPEAT, Streams, epoch_mix
from prefetchd.messages.counters import WriterCounters
from prefetchd.write.choices import PICKS, Choices
from prefetchd.write.composition import Composition
from prefetchd.write.frames import Frames
from prefetchd.write.mixing import STEP_BYTES, Mixer
from prefetchd.write.objects import OpenObject

NAMES = ("web", "code", "books")
WEIGHTS = (0.6, 0.3, 0.1)
OBJECTS = (80, 300, 20)  # the e2e test's objects per source
RECORDS = ((20, 40), (1, 1), (10, 30))  # records per object (inclusive)
RECORD_BYTES = ((230, 640), (510, 3010), (1024, 1536))  # listed bytes of a record (tar: header)
DRAWS = ("source", "uniform", "weighted")


@dataclass(frozen=True)
class Shape:
    """The synthetic sources: objects, records per object and record bytes, per source."""

    objects: tuple[int, ...] = OBJECTS
    records: tuple[tuple[int, int], ...] = RECORDS
    record_bytes: tuple[tuple[int, int], ...] = RECORD_BYTES
    weights: tuple[float, ...] = WEIGHTS


@dataclass
class Source:
    """One source's objects: each one's records' sizes and its listed bytes, in key order."""

    records: list[array[int]] = field(default_factory=list)
    sizes: array[int] = field(default_factory=lambda: array("Q"))


def make_sources(shape: Shape, seed: int) -> list[Source]:
    rng = random.Random(seed)
    sources = []
    for count, (lo, hi), (blo, bhi) in zip(
        shape.objects, shape.records, shape.record_bytes, strict=True
    ):
        src = Source()
        for _ in range(count):
            sizes = array("Q", [rng.randint(blo, bhi) for _ in range(rng.randint(lo, hi))])
            src.records.append(sizes)
            src.sizes.append(sum(sizes))
        sources.append(src)
    return sources


@dataclass(frozen=True)
class Arrival:
    """Object ``seq`` of the epoch's download order: its source, records' sizes and listed
    bytes."""

    seq: int
    source: int
    records: array[int]
    size: int

    @property
    def count(self) -> int:
        return len(self.records)


def download_order(
    sources: Sequence[Source], shape: Shape, seed: int, epoch: int, *, balanced: bool = True
) -> list[Arrival]:
    """The epoch's objects in the order the downloader plans them (``epoch_mix``; with
    ``balanced`` off, as merged, before the balance for the writers)."""
    streams = Streams(
        sizes=tuple(s.sizes for s in sources),
        base=shape.weights,
        names=NAMES[: len(sources)],
        schedule=(),
        on_exhausted=REPEAT,
        seed=seed,
    )
    mix = epoch_mix(streams, epoch, balanced=balanced)
    return [
        Arrival(seq, s, sources[s].records[row], sources[s].sizes[row])
        for seq, (s, row) in enumerate(zip(mix.sources, mix.rows, strict=True))
    ]


class _Reader:
    """What the Mixer asks of an ``ObjectReader``: the first batch of an object it opens."""

    shuffle_bytes = 4 * 1024 * 1024

    def start(self, obj: OpenObject) -> None:
        obj.taken, obj.started = 0, True
        obj.frames, obj.cursor = next(obj.batches), 0

    def quarantine(self, obj: OpenObject, exc: Exception) -> None:
        raise exc


def _counters() -> WriterCounters:
    return {"objects_consumed": 0}  # type: ignore[typeddict-item]


class WeightedChoices(Choices):
    """The draw that was tried before: each record's source at random, weighted by the rates
    the round robin uses, then uniformly among its open objects (no credit kept)."""

    def draw_ahead(self, mixable: list[OpenObject]) -> None:
        draw = self.source_draw(mixable)
        if draw is None:
            super().draw_ahead(mixable)
            return
        rates, groups = array("Q", draw.rates), array("I", draw.groups)
        by_source: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            by_source.setdefault(g, []).append(i)
        sources = sorted(by_source)
        rng = random.Random(self.mix_state)
        count = min(PICKS, sum(len(o.frames) - o.cursor for o in mixable) + 1)
        chosen = rng.choices(sources, [rates[s] for s in sources], k=count)
        picks = array("I", [rng.choice(by_source[s]) for s in chosen])
        self.picks_from, self.draw_from = (self.mix_state, count), None
        self.picks, self.mix_state, self.pick_at = picks.tobytes(), rng.getrandbits(64), 0


def _frames(sizes: array[int]) -> Frames:
    """An object's records as one batch of frames of their sizes (frame bytes are listed bytes,
    as with uncompressed TFRecord)."""
    return Frames.of(bytes(sum(sizes)), array("Q", itertools.accumulate(sizes)))


@dataclass
class WriterSim:
    """One writer: its real ``Mixer``, its turn of the download order, its clock (records
    written, plus time idle) and what it wrote: each record's source (``out``) and object
    (``taken``: its seq)."""

    mixer: Mixer
    turn: list[Arrival]
    arrive: list[float]
    clock: float = 0.0
    next_claim: int = 0
    out: bytearray = field(default_factory=bytearray)
    taken: array[int] = field(default_factory=lambda: array("L"))
    composition: Composition | None = None  # if set, told each step as the writer tells it

    def claimable(self) -> bool:
        return self.next_claim < len(self.turn) and self.arrive[self.next_claim] <= self.clock

    def done(self) -> bool:
        return self.next_claim >= len(self.turn) and not self.mixer.open


def simulate(
    order: Sequence[Arrival],
    *,
    draw: str = "source",
    mix: int = 64,
    writers: int = 2,
    supply: float = math.inf,
    seed: int = 3,
    epoch: int = 0,
) -> list[bytes]:
    """Each writer's records (their sources, one byte each) in the order it wrote them.
    ``supply``: the downloader's pace as a multiple of what the writers take (objects arrive
    in ``order``, at listed bytes over that pace); ``inf``: all are in ready/ from the start."""
    sims = writer_sims(order, draw=draw, mix=mix, writers=writers, supply=supply, seed=seed)
    run_writers(sims, mix, epoch)
    return [bytes(s.out) for s in sims]


def writer_sims(
    order: Sequence[Arrival],
    *,
    draw: str = "source",
    mix: int = 64,
    writers: int = 2,
    supply: float = math.inf,
    seed: int = 3,
) -> list[WriterSim]:
    """The writers, each with its turn of ``order`` (``seq % writers``) and when each of its
    objects arrives in ready/."""
    mean_bytes = sum(a.size for a in order) / max(1, sum(a.count for a in order))
    pace = supply * writers * mean_bytes  # listed bytes the downloader delivers per time unit
    arrive, done = [], 0.0
    for a in order:
        done += a.size
        arrive.append(0.0 if math.isinf(pace) else done / pace)
    sims = []
    for w in range(writers):
        cls = WeightedChoices if draw == "weighted" else Choices
        choices = cls(seed, w, by_source=draw != "uniform")
        mixer = Mixer(_Reader(), _counters(), choices)  # type: ignore[arg-type]
        turn = [a for a in order if a.seq % writers == w]
        sims.append(WriterSim(mixer, turn, [arrive[a.seq] for a in turn]))
    return sims


def run_writers(sims: Sequence[WriterSim], mix: int, epoch: int) -> None:
    """Run the writers until each has written all of its objects: the one whose clock is
    behind takes the next step."""
    while True:
        live = [s for s in sims if not s.done()]
        if not live:
            return
        _step(min(live, key=lambda s: s.clock), mix, epoch)


def _step(sim: WriterSim, mix: int, epoch: int) -> None:
    """One writer's turn: claim what arrived (up to ``mix`` open), then draw one step; or wait
    for the next arrival when nothing is open."""
    mixer = sim.mixer
    while len(mixer.open) < mix and sim.claimable():
        a = sim.turn[sim.next_claim]
        sim.next_claim += 1
        obj = OpenObject(
            f"e{epoch:05d}-{a.seq:09d}",
            f"{NAMES[a.source]}/{a.seq}",
            epoch,
            Path("/dev/null"),
            iter([_frames(a.records)]),
            meta={"size": a.size, "source": a.source},
            source=a.source,
        )
        mixer.add(obj)
    if not mixer.open:
        sim.clock = max(sim.clock, sim.arrive[sim.next_claim])
        return
    mixable = mixer.mixable()
    drawn = mixer.draw(mixable, STEP_BYTES)
    choices = mixer.choices
    picks = memoryview(choices.picks).cast("I")[drawn.stop - drawn.records : drawn.stop]
    sim.out += bytes(mixable[p].source for p in picks)
    sim.taken.extend(int(mixable[p].key.rpartition("/")[2]) for p in picks)
    if sim.composition is not None and drawn.records:
        assert choices.picks_from is not None
        sim.composition.step(
            mixable, choices.picks_from, drawn.stop - drawn.records, drawn.stop, choices.draw_from
        )
    mixer.advance(mixable, drawn)
    sim.clock += drawn.records


def trainer_order(outs: Sequence[bytes], shard_records: int) -> bytes:
    """What a trainer reads: the writers' shards of ``shard_records`` records, one after
    another in the order they were published (a writer's clock is its records: writers that
    write at the same pace publish in turn)."""
    shards: list[tuple[int, int, int, int]] = []  # (published at, writer, start, end)
    for w, out in enumerate(outs):
        for start in range(0, len(out), shard_records):
            end = min(len(out), start + shard_records)
            shards.append((end, w, start, end))
    shards.sort()
    read = bytearray()
    for _, w, start, end in shards:
        read += outs[w][start:end]
    return bytes(read)


def worst_windows(records: bytes, window: int, sources: int) -> list[tuple[float, int]]:
    """Per source: the largest difference between its share of ``window`` consecutive
    records and its share of all, and where that window starts."""
    n = len(records)
    if n < window:
        return [(0.0, 0)] * sources
    worst = []
    for s in range(sources):
        share = records.count(s) / n
        # running count of source s in records[start:start+window]
        inside = records[:window].count(s)
        best, at = abs(inside / window - share), 0
        for start in range(1, n - window + 1):
            inside += (records[start + window - 1] == s) - (records[start - 1] == s)
            d = abs(inside / window - share)
            if d > best:
                best, at = d, start
        worst.append((best, at))
    return worst


def record_shares(records: bytes, sources: int) -> list[float]:
    return [records.count(s) / max(1, len(records)) for s in range(sources)]


@dataclass(frozen=True)
class Result:
    """One variant's worst windows (points of share, per source) and the epoch's shares."""

    shares: tuple[float, ...]
    worst_1k: tuple[float, ...]
    worst_10k: tuple[float, ...]
    records: int
    writers: tuple[float, float]  # the lowest and highest writer's own share of source 0
    alone: float  # the worst 1,000-record window of one writer against its own shares


def run(
    *,
    draw: str = "source",
    mix: int = 64,
    writers: int = 2,
    supply: float = math.inf,
    scale: int = 1,
    epochs: int = 2,
    shape: Shape = Shape(),
    shard_records: int = 1300,
    seed: int = 3,
    balanced: bool = True,
) -> Result:
    """The worst windows over ``epochs`` epochs of the synthetic sources (``scale`` times the
    test's objects), read as a trainer reads the writers' shards."""
    shape = Shape(
        tuple(n * scale for n in shape.objects), shape.records, shape.record_bytes, shape.weights
    )
    sources = make_sources(shape, seed)
    n = len(sources)
    w1k, w10k, shares, total = [0.0] * n, [0.0] * n, [0.0] * n, 0
    low, high, alone = 1.0, 0.0, 0.0
    for epoch in range(epochs):
        order = download_order(sources, shape, seed, epoch, balanced=balanced)
        outs = simulate(
            order, draw=draw, mix=mix, writers=writers, supply=supply, seed=seed, epoch=epoch
        )
        read = trainer_order(outs, shard_records)
        total += len(read)
        for s, (d, _) in enumerate(worst_windows(read, 1000, n)):
            w1k[s] = max(w1k[s], d)
        for s, (d, _) in enumerate(worst_windows(read, 10000, n)):
            w10k[s] = max(w10k[s], d)
        shares = record_shares(read, n)
        for out in outs:
            own = record_shares(out, n)[0]
            low, high = min(low, own), max(high, own)
            alone = max(alone, *(d for d, _ in worst_windows(out, 1000, n)))
    return Result(tuple(shares), tuple(w1k), tuple(w10k), total // epochs, (low, high), alone)


def _ranges(text: str) -> tuple[tuple[int, int], ...]:
    """``web=20-40,code=1,books=10-30`` -> records per object per source."""
    out = []
    for part in text.split(","):
        _, _, span = part.partition("=")
        lo, _, hi = span.partition("-")
        out.append((int(lo), int(hi or lo)))
    return tuple(out)


def _points(values: Sequence[float]) -> str:
    return " ".join(f"{100 * v:5.1f}" for v in values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draw", choices=DRAWS, action="append")
    parser.add_argument("--split", choices=("balanced", "merged"), action="append")
    parser.add_argument("--mix", type=int, action="append")
    parser.add_argument("--writers", type=int, action="append")
    parser.add_argument("--supply", type=float, action="append")
    parser.add_argument("--records", action="append", help="web=20-40,code=1,books=10-30")
    parser.add_argument("--scale", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--shard-records", type=int, default=1300)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    variants = itertools.product(
        args.draw or DRAWS,
        args.split or ["balanced"],
        args.mix or [64],
        args.writers or [2],
        args.supply or [math.inf],
        [_ranges(r) for r in args.records] if args.records else [RECORDS],
    )
    print("worst |window share - epoch share| in points, per source (" + " ".join(NAMES) + ")")
    print(
        f"{'draw':8} {'split':8} {'mix':>4} {'wr':>3} {'supply':>6} {'records':24} "
        f"{'shares %':17} {'1,000 records':17} {'10,000 records':17} {'writers':11} alone"
    )
    for draw, split, mix, writers, supply, records in variants:
        shape = Shape(records=records)
        r = run(
            draw=draw,
            mix=mix,
            writers=writers,
            supply=supply,
            scale=args.scale,
            epochs=args.epochs,
            shape=shape,
            shard_records=args.shard_records,
            seed=args.seed,
            balanced=split == "balanced",
        )
        span = ",".join(f"{a}-{b}" if a != b else str(a) for a, b in records)
        print(
            f"{draw:8} {split:8} {mix:4} {writers:3} {supply:6} {span:24} {_points(r.shares):17} "
            f"{_points(r.worst_1k):17} {_points(r.worst_10k):17} "
            f"{_points(r.writers):11} {100 * r.alone:5.1f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
