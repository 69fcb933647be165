"""The trainer's moves in the RAM disk's hand-off, each one rename (see ``layout``'s tree).

- claim: ``ready/<shard>`` → ``claimed/<claimant>-<shard>`` (``ReadyFiles``); whoever renames
  a shard first has it, so trainer processes on one host get disjoint shards;
- give back: ``claimed/<claimant>-<shard>`` → ``ready/<shard>``, unread, for another stream;
- retire: ``claimed/<claimant>-<shard>`` → ``done/``, read: the daemon notes it delivered and
  deletes it.

And the question they answer together: is an epoch over for this process (``epoch_over``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from prefetchd.atomic import holds_lock
from prefetchd.budget import rename_under_budget_lock
from prefetchd.layout import Layout, parse_claim_name


def ready_names(layout: Layout, prefix: str) -> list[str]:
    """The shards in ``ready/`` whose names start with ``prefix``, in order."""
    try:
        return sorted(n for n in os.listdir(layout.ram_ready) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def give_back(layout: Layout, claimed: str) -> None:
    """Return the claim ``claimed`` to ``ready/`` unread (gone already: nothing to do)."""
    shard = parse_claim_name(claimed)
    with contextlib.suppress(FileNotFoundError):
        if shard is not None:
            # backwards: under the budget lock, or a writer adding up ram_dir could miss it
            rename_under_budget_lock(
                layout, layout.ram_claimed / claimed, layout.ram_ready / shard[1]
            )


def retire(claimed: Path, done: Path, name: str) -> None:
    """Hand the finished claim ``name`` to the daemon: move it from ``claimed`` to ``done``,
    where the daemon notes it delivered and deletes it. A rename costs the trainer a few
    microseconds where the deletion costs it the freeing of every page of the shard. Without
    ``done/`` (the RAM disk of an older release) the shard is deleted here."""
    try:
        os.rename(claimed / name, done / name)
    except FileNotFoundError:
        if not done.is_dir():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(claimed / name)


def epoch_over(layout: Layout, epoch: int, prefix: str, claimant: str) -> bool:
    """Epoch k is over once it is complete, nothing of it is ready, and no claim of a dead
    trainer is waiting to be returned to ready/ (the daemon does that about once a second)."""
    if not layout.complete_marker(epoch).exists() or ready_names(layout, prefix):
        return False
    return not _orphaned_claims(layout, prefix, claimant)


def _orphaned_claims(layout: Layout, prefix: str, own: str) -> bool:
    """Whether ``claimed/`` holds a shard of ``prefix`` whose claimant's lock is free."""
    try:
        names = os.listdir(layout.ram_claimed)
    except FileNotFoundError:
        return False
    for name in names:
        parsed = parse_claim_name(name)
        if parsed is None or parsed[0] == own or not parsed[1].startswith(prefix):
            continue
        if not holds_lock(layout.consumer_lock(parsed[0])):
            return True
    return False
