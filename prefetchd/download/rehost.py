"""The interrupted epoch of a job resumed with another number of hosts: ``split_remainder``.

With ``sharding.resume_from``, the old job's hosts (``num_workers`` N) saved positions saying
which of their objects of epoch E their trainers finished (``trained_objects.py``, by ordinal in
each old host's epoch order). Every new host (M of them) lists the whole source, works out for every
key its old host and its ordinal there, and keeps as its first epoch the keys that are its own
under M (``order.host_of(key, M)``) and that their old host had not finished, with the records
already trained of the ones begun (``skips``, which the writer leaves out). The M hosts do this
alone and alike, so together they deliver exactly the records no old host trained, once; later
epochs are each host's share under M, as for any job.

The ordinals are places in each old host's order over the listing, so the listing must be the
one the old hosts had: ``split_remainder`` recomputes each old host's share's ``ListingId``
from the new listing and refuses one that differs from the one its positions name
(``host_positions.check_listings``, exit 2). The supervisor does the same before it touches
anything (``check_source``), listing the source once more for it.

With several sources (``sources:``, ``on_exhausted: repeat``), ``split_mixed``: an old host's
ordinals are places in its mixed plan (``mixture.epoch_mix`` over its shares of every source),
which each new host rebuilds from every source's whole listing; each read ``(source, period,
key)`` not finished whose key is its own under M goes into its ``Remainder.mix`` (keeping its
period, so its local name), ordered by where it stood in its old plan, then balanced for the
writers. The listing checked is each old host's ``ListingId.of_sources`` over its shares.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from prefetchd.config import Config, ShardingConfig
from prefetchd.download.mixture import EpochMix, Streams, balanced_order, epoch_mix
from prefetchd.download.order import epoch_permutation, host_of
from prefetchd.download.share import ListingDigest, ShareTable
from prefetchd.download.store import boot_failure, list_share, make_client
from prefetchd.errors import RuntimeFailure
from prefetchd.exactly_once.host_positions import HostPositions, check_listings
from prefetchd.exactly_once.trained_objects import ALL_TRAINED, ListingId, Ranges


@dataclass
class Remainder:
    """Epoch ``epoch`` of a job resumed on another number of hosts: the rows of this host's
    share to deliver, in order, and the record ranges already trained of some (by row)."""

    epoch: int
    rows: array[int]
    skips: dict[int, Ranges] = field(default_factory=dict)
    objects_trained: int = 0  # objects of this share the old hosts had finished
    records_skipped: int = 0  # records the writers leave out of objects begun (known ranges)
    # several sources: the reads to deliver, in order (``rows`` is then empty and ``skips``
    # is by place in ``mix``, a read being a (source, period, row), not a row)
    mix: EpochMix | None = None


def split_remainder(
    listed: ShareTable, config: Config, hosts: HostPositions
) -> tuple[ShareTable, Remainder]:
    """This host's share under ``config``'s sharding, from the whole listing ``listed``, and
    its remainder of epoch ``hosts.epoch``."""
    old, epochs = hosts.num_workers, config.epochs
    new, index = config.sharding.num_workers, config.sharding.worker_index
    owner = array("I")  # per row of ``listed``: its old host
    rank = array("Q")  # ... and its place in that host's key-sorted share
    counts = [0] * old
    digests = [ListingDigest() for _ in range(old)]  # each old host's share, as listed now
    mine = array("Q")  # rows of ``listed`` that are this host's now
    for row, obj in enumerate(listed):
        h = host_of(obj.key, old) if old > 1 else 0
        owner.append(h)
        rank.append(counts[h])
        counts[h] += 1
        digests[h].add(obj)
        if new == 1 or host_of(obj.key, new) == index:
            mine.append(row)
    check_listings(hosts, [d.identity() for d in digests])
    ordinals: dict[int, array[int]] = {}
    for h in range(old):
        if h in hosts.finished:
            continue
        perm = epoch_permutation(
            counts[h], seed=epochs.seed, epoch=hosts.epoch, shuffle=epochs.shuffle
        )
        inverse = array("Q", bytes(8 * counts[h]))
        for ordinal, r in enumerate(perm):
            inverse[r] = ordinal
        ordinals[h] = inverse
    share = ShareTable.of(listed[row] for row in mine)
    keep = array("Q")
    skips: dict[int, Ranges] = {}
    trained = skipped = 0
    for new_row, row in enumerate(mine):
        h = owner[row]
        if h in hosts.finished:
            trained += 1
            continue
        ranges = hosts.trained[h].trained(ordinals[h][rank[row]])
        if ranges is ALL_TRAINED:
            trained += 1
            continue
        if ranges:
            skips[len(keep)] = ranges
            skipped += sum(b - a for a, b in ranges)
        keep.append(new_row)
    order = epoch_permutation(
        len(keep), seed=epochs.seed, epoch=hosts.epoch, shuffle=epochs.shuffle
    )
    rows = array("Q", (keep[i] for i in order))
    by_row = {keep[i]: skips[i] for i in skips}
    return share, Remainder(hosts.epoch, rows, by_row, trained, skipped)


def streams_of(config: Config, sizes: Sequence[array[int]]) -> Streams:
    """The sources' streams of ``config`` over shares of these sizes (``mixture.py``)."""
    epochs = config.epochs
    return Streams(
        sizes=tuple(sizes),
        base=tuple(s.weight for s in config.sources),
        names=tuple(s.name for s in config.sources),
        schedule=epochs.weights_by_epoch,
        on_exhausted=epochs.on_exhausted,
        seed=epochs.seed,
        shuffle=epochs.shuffle,
    )


@dataclass
class _OldHosts:
    """Every source's whole listing split by old host: each old host's rows of each source (in
    key order, as that host listed its share) and its ``ListingId`` over all its shares as
    listed now (``identities``), this host's rows under the new sharding, and each whole row's
    place in this host's share (``NOT_MINE`` if it is another host's)."""

    old_rows: list[list[array[int]]]  # [old host][source] -> rows of the whole listing
    identities: list[ListingId]  # [old host] -> its shares' ListingId.of_sources
    mine: list[array[int]]  # [source] -> rows of the whole listing that are this host's now
    new_row: list[array[int]]  # [source][whole row] -> row in this host's share, or NOT_MINE


NOT_MINE = 2**64 - 1


def _split_by_host(listed: Sequence[ShareTable], config: Config, old: int) -> _OldHosts:
    new, index = config.sharding.num_workers, config.sharding.worker_index
    old_rows = [[array("Q") for _ in listed] for _ in range(old)]
    digests = [[ListingDigest() for _ in listed] for _ in range(old)]
    split = _OldHosts(old_rows, [], [], [])
    for s, table in enumerate(listed):
        mine, new_row = array("Q"), array("Q")
        for row, obj in enumerate(table):
            h = host_of(obj.key, old) if old > 1 else 0
            old_rows[h][s].append(row)
            digests[h][s].add(obj)
            if new == 1 or host_of(obj.key, new) == index:
                new_row.append(len(mine))
                mine.append(row)
            else:
                new_row.append(NOT_MINE)
        split.mine.append(mine)
        split.new_row.append(new_row)
    split.identities = [ListingId.of_sources([d.identity() for d in ds]) for ds in digests]
    return split


def split_mixed(
    listed: Sequence[ShareTable], config: Config, hosts: HostPositions
) -> tuple[list[ShareTable], Remainder]:
    """This host's share of every source (``sources:``) from each source's whole listing
    ``listed``, and its remainder of epoch ``hosts.epoch``: every read of each old host's mixed
    plan (``mixture.epoch_mix`` over that host's shares) that its trainers had not finished and
    whose object is this host's now, with its source and period (so its local name, which
    hashes them, stays that of the read), the records already trained of those begun left out
    (``skips``, by place in ``Remainder.mix``). The reads are ordered by where each stood in
    its old host's plan, as a fraction of that plan, then balanced for the writers."""
    old, epoch = hosts.num_workers, hosts.epoch
    split = _split_by_host(listed, config, old)
    check_listings(hosts, split.identities, len(listed))
    whole_sizes = [table.sizes() for table in listed]
    reads: list[tuple[float, int, int, int, int, int]] = []  # (at, host, seq, source, ...)
    ranges_of: dict[tuple[int, int], Ranges] = {}
    trained = skipped = 0
    for h, rows in enumerate(split.old_rows):
        sizes = [array("Q", (whole_sizes[s][r] for r in rows[s])) for s in range(len(listed))]
        plan = epoch_mix(streams_of(config, sizes), epoch)
        for seq in range(len(plan)):
            source, period, row = plan.at(seq)
            new_row = split.new_row[source][rows[source][row]]
            if new_row == NOT_MINE:
                continue
            ranges = ALL_TRAINED if h in hosts.finished else hosts.trained[h].trained(seq)
            if ranges is ALL_TRAINED:
                trained += 1
                continue
            if ranges:
                ranges_of[h, seq] = ranges
                skipped += sum(b - a for a, b in ranges)
            reads.append(((seq + 0.5) / len(plan), h, seq, source, period, new_row))
    reads.sort()
    merged = EpochMix(array("B"), array("L"), array("Q"))
    for _, _, _, source, period, new_row in reads:
        merged.sources.append(source)
        merged.periods.append(period)
        merged.rows.append(new_row)
    # where each read went when balanced, for its skips
    order = balanced_order(merged) if len(listed) > 1 else array("L", range(len(merged)))
    mix = EpochMix(
        array("B", (merged.sources[i] for i in order)),
        array("L", (merged.periods[i] for i in order)),
        array("Q", (merged.rows[i] for i in order)),
    )
    skips: dict[int, Ranges] = {}
    for place, i in enumerate(order):
        ranges = ranges_of.get((reads[i][1], reads[i][2]))
        if ranges:
            skips[place] = ranges
    shares = [
        ShareTable.of(table[row] for row in mine)
        for table, mine in zip(listed, split.mine, strict=True)
    ]
    return shares, Remainder(epoch, array("Q"), skips, trained, skipped, mix)


def old_listings(listed: ShareTable, old: int) -> list[ListingDigest]:
    """Each of ``old`` hosts' share of the whole listing ``listed``, digested."""
    digests = [ListingDigest() for _ in range(old)]
    for obj in listed:
        digests[host_of(obj.key, old) if old > 1 else 0].add(obj)
    return digests


def check_source(config: Config, hosts: HostPositions) -> list[int]:
    """List every source whole and check that each old host's share (of every source) is the
    one its positions were saved over (``ResumeError``, exit 2, naming the first that is not).
    Returns the old hosts whose positions do not say (saved by an earlier release;
    ``unchecked_note``)."""
    whole = replace(config, sharding=ShardingConfig())
    client = make_client(config, pool=1)
    tables = []
    for source in config.sources:
        listed = ShareTable()
        try:
            for obj in list_share(client, whole, source=source):
                listed.append(obj)
            listed.finish()
        except RuntimeFailure:
            raise
        except Exception as exc:
            raise boot_failure(config, exc, source) from None
        tables.append(listed)
    if config.mixed:
        split = _split_by_host(tables, config, hosts.num_workers)
        return check_listings(hosts, split.identities, len(tables))
    now = [digest.identity() for digest in old_listings(tables[0], hosts.num_workers)]
    return check_listings(hosts, now)


def unchecked_note(hosts: HostPositions, unchecked: list[int]) -> str:
    """What the user is told of old hosts whose positions do not name their listing."""
    return (
        f"{hosts.where}: the positions of old host(s) {', '.join(map(str, unchecked))} do not "
        "name the listing they were saved over (saved by an earlier release): that the source "
        "still holds the same keys cannot be checked, and keys added or removed since would "
        "train records twice or never"
    )
