"""What a trainer resumed from a saved position takes back before it claims anything new.

After a crash the daemon returns a dead trainer's kept shards to ``ready/`` (about once a
second); a stream resumed from the position saved before it first takes back what that one
held (``reclaim``: freeing the shards it covers, reading first the ones it was in, skipping
their trained records): exactly once relative to it. Several trainer processes of one host
(DDP ranks) take back theirs in the main process first (``take_back``), and a trainer that
saved a position frees what it covers (``free_saved``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from prefetchd.consume.claims import retire
from prefetchd.consume.position_format import check_job_id, parse_position
from prefetchd.consume.releaser import ShardReleaser
from prefetchd.consume.stream_position import StreamPosition
from prefetchd.errors import PositionError
from prefetchd.fence import read_fence
from prefetchd.layout import Layout, claim_name

# the resumed trainer's lines keep their logger name (it is in every line)
log = logging.getLogger("prefetchd.consume.stream_position")


def reclaim(stream: StreamPosition, releaser: ShardReleaser) -> None:
    """Take back what the saved position's process held, before claiming anything new:
    the shards it covers are freed, those it was reading are claimed for ``stream``
    (``reclaimed``, yielded first, their trained records skipped). Wherever the daemon
    has put them (still under the dead claimant, or back in ``ready/``), no other trainer
    process can get them first if every process of the job reclaims before it claims.

    Raises ``PositionError`` if a shard the position was reading is gone (the RAM disk was
    emptied, or a later position was saved and its shards freed)."""
    saved = stream.saved
    if saved is None or saved.claimant is None:
        return
    owners = [saved.claimant, *filter(None, [saved.holder])]
    where = [f"epoch {saved.epoch}: {len(saved.consumed)} shards done"]
    for shard in sorted(saved.consumed):
        taken = _take(stream.layout, shard, owners, releaser)
        if taken is not None:
            stream.skip.discard(shard)
            stream.free([taken])
    for shard, trained in sorted(saved.records.items()):
        taken = _take(stream.layout, shard, owners, releaser)
        if taken is not None:
            stream.reclaimed.append(taken)
            where.append(f"{shard} from record {trained}")
            log.info(
                "resuming epoch %d inside %s after its first %d records",
                saved.epoch,
                shard,
                trained,
            )
        elif trained:
            raise PositionError(
                f"position: shard {shard}, of which it trained {trained} records, is no "
                "longer on the RAM disk (a later position of this job was saved and freed "
                "it, or the daemon's RAM disk was emptied): resume from the newest position"
            )
    releaser.note_resumed(", ".join(where))


def _take(lay: Layout, shard: str, owners: list[str], releaser: ShardReleaser) -> str | None:
    """Claim ``shard`` for this process from a dead owner's claim or ``ready/``."""
    mine = claim_name(releaser.claimant, shard)
    sources = [lay.ram_claimed / claim_name(o, shard) for o in owners] + [lay.ram_ready / shard]
    for _ in range(3):  # the daemon may move it from claimed/ to ready/ meanwhile
        for source in sources:
            releaser.track(mine, retain=True)
            try:
                os.rename(source, lay.ram_claimed / mine)
            except FileNotFoundError:
                releaser.untrack(mine)
                continue
            return mine
    return None


def take_back(layout: Layout, position: dict[str, Any], keeper: str) -> None:
    """Take back, in one process for all of its streams, what a saved position names before
    any trainer process of the job claims a shard: the shards it covers are freed, those it was
    reading are claimed for ``keeper`` (a live claimant), and ``position`` is updated to name
    ``keeper`` as their claimant, so the stream resumed from it takes them from there."""
    saved = parse_position(position)
    fence = read_fence(layout.job_fence)
    if fence is not None:  # the names it lists may be another job's shards
        check_job_id(saved, fence.job)
    owners = [o for o in (saved.claimant, saved.holder) if o is not None]
    lay = layout
    for shard in [*sorted(saved.consumed), *sorted(saved.records)]:
        target = (
            lay.ram_claimed / claim_name(keeper, shard)
            if shard in saved.records
            else lay.ram_done / claim_name(keeper, shard)
        )
        sources = [lay.ram_claimed / claim_name(o, shard) for o in owners] + [lay.ram_ready / shard]
        for source in sources * 2:  # the daemon may move it from claimed/ to ready/ meanwhile
            with contextlib.suppress(FileNotFoundError):
                os.rename(source, target)
                break
    if saved.records:
        position["claimant"] = keeper


def free_saved(layout: Layout, position: Mapping[str, Any], holder: str | None) -> int:
    """Free the shards a position that was saved covers (its ``consumed``), wherever its
    process or ``holder`` keeps them; returns how many were freed."""
    claimant = position.get("claimant")
    owners = [o for o in (claimant, position.get("holder"), holder) if isinstance(o, str)]
    freed = 0
    for shard in position.get("consumed", []):
        for owner in owners:
            name = claim_name(owner, shard)
            if (layout.ram_claimed / name).exists():
                retire(layout.ram_claimed, layout.ram_done, name)
                freed += 1
                break
    return freed
