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
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field, replace

from prefetchd.config import Config, ShardingConfig
from prefetchd.download.order import epoch_permutation, host_of
from prefetchd.download.share import ListingDigest, ShareTable
from prefetchd.download.store import boot_failure, list_share, make_client
from prefetchd.errors import RuntimeFailure
from prefetchd.exactly_once.host_positions import HostPositions, check_listings
from prefetchd.exactly_once.trained_objects import ALL_TRAINED, Ranges


@dataclass
class Remainder:
    """Epoch ``epoch`` of a job resumed on another number of hosts: the rows of this host's
    share to deliver, in order, and the record ranges already trained of some (by row)."""

    epoch: int
    rows: array[int]
    skips: dict[int, Ranges] = field(default_factory=dict)
    objects_trained: int = 0  # objects of this share the old hosts had finished
    records_skipped: int = 0  # records the writers leave out of objects begun (known ranges)


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


def old_listings(listed: ShareTable, old: int) -> list[ListingDigest]:
    """Each of ``old`` hosts' share of the whole listing ``listed``, digested."""
    digests = [ListingDigest() for _ in range(old)]
    for obj in listed:
        digests[host_of(obj.key, old) if old > 1 else 0].add(obj)
    return digests


def check_source(config: Config, hosts: HostPositions) -> list[int]:
    """List the whole source and check that each old host's share is the one its positions
    were saved over (``ResumeError``, exit 2, naming the first that is not). Returns the old
    hosts whose positions do not say (saved by an earlier release; ``unchecked_note``)."""
    whole = replace(config, sharding=ShardingConfig())
    listed = ShareTable()
    try:
        for obj in list_share(make_client(config, pool=1), whole):
            listed.append(obj)
        listed.finish()
    except RuntimeFailure:
        raise
    except Exception as exc:
        raise boot_failure(config, exc) from None
    now = [digest.identity() for digest in old_listings(listed, hosts.num_workers)]
    return check_listings(hosts, now)


def unchecked_note(hosts: HostPositions, unchecked: list[int]) -> str:
    """What the user is told of old hosts whose positions do not name their listing."""
    return (
        f"{hosts.where}: the positions of old host(s) {', '.join(map(str, unchecked))} do not "
        "name the listing they were saved over (saved by an earlier release): that the source "
        "still holds the same keys cannot be checked, and keys added or removed since would "
        "train records twice or never"
    )
