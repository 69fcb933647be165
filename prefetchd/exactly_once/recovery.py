"""What a restarted daemon finds on its disks, and what it does about files that vanished.

Run by the supervisor at start-up, after it owns its directories and before any child starts,
when it resumes an unfinished job. ``state_dir/disks.json`` says which incarnation of ram_dir
and cache_dir (the tokens of their owner markers, ``owner.py``) and which boot the state was
written in::

    {"version": 1, "boot_id": "…", "tokens": {"output.ram_dir": "…", "download.cache_dir": "…"}}

Losses it looks for:

- published shards no trainer finished that are no longer on the RAM disk (``ledger.assess``:
  the RAM disk was emptied, by a reboot or by hand);
- raw objects a writer had started (its journal holds a position in them) that are gone from
  ``cache_dir/claimed``; and, if cache_dir itself was emptied, every object of an epoch that
  was being downloaded.

Whole objects that vanished before any writer read them are fetched again by the downloader
(its start-up sweep, ``download/``). For the rest: let k be the first epoch with a loss. If no shard
of epoch k or later was finished by a trainer yet, epochs k and later are started again from
the source (their files and state are swept; the epoch order is seeded, so the same records
come again): exactly once. Otherwise the records cannot be re-created exactly once (the ones
trainers read would come twice), and the daemon fails with the reason instead.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from prefetchd.atomic import write_atomic
from prefetchd.exactly_once.journal import Head, JournalEntry, read_heads
from prefetchd.exactly_once.ledger import (
    Assessment,
    Commit,
    assess,
    published_shards,
    read_ledger,
    record_delivered,
)
from prefetchd.layout import (
    Layout,
    epoch_prefix,
    file_epoch,
    is_own_file,
    parse_claim_name,
    parse_shard_name,
    unpart,
    writer_claim_name,
)
from prefetchd.owner import Ownership, boot_id

log = logging.getLogger(__name__)

DISKS_VERSION = 1
RAM, CACHE = "output.ram_dir", "download.cache_dir"


@dataclass(frozen=True)
class Disks:
    boot_id: str
    tokens: dict[str, str]


def read_disks(layout: Layout) -> Disks | None:
    """``disks.json``, or None if there is none (a fresh job, or one an older release began)."""
    try:
        raw = json.loads(layout.disks_file.read_text(encoding="utf-8"))
        tokens = {str(k): str(v) for k, v in raw["tokens"].items()}
        return Disks(str(raw["boot_id"]), tokens)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_disks(layout: Layout, ownership: Ownership) -> None:
    """Record the incarnation of the directories the state describes from now on."""
    raw = {"version": DISKS_VERSION, "boot_id": boot_id(), "tokens": ownership.tokens()}
    write_atomic(layout.disks_file, json.dumps(raw).encode(), fsync=True)


def recover(layout: Layout, ownership: Ownership) -> str | None:
    """Re-create what vanished (see the module), or return why it cannot (None: all is well).

    Raises ``JournalError`` for a journal this version cannot read."""
    disks = read_disks(layout)
    ram_ok, cache_ok = _intact(disks, ownership, RAM), _intact(disks, ownership, CACHE)
    journals = read_heads(layout)
    candidates, delivered = read_ledger(layout)
    commits = {i: Commit(head.last.counter, head.last.shard) for i, head in journals.items()}
    published = published_shards(candidates, commits)
    found = assess(published, delivered, _shards_present(layout), intact=ram_ok)
    if ram_ok:  # shards finished while the daemon was down: remember them for a later reboot
        record_delivered(layout, sorted(found.delivered - delivered))
    losses = _losses(layout, found, journals, cache_ok)
    if not losses:
        return None
    first = min(losses)
    cause = _cause(disks)
    if found.delivered_from(first) == 0:
        log.warning(
            "%s; nothing of epoch %d or later was read by a trainer yet: starting epoch %d "
            "again from the source",
            losses[first] + cause,
            first,
            first,
        )
        reset_epochs(layout, first, journals)
        return None
    return (
        f"{losses[first]}{cause}; trainers already read "
        f"{found.delivered_from(first)} shards of epoch {first} or later, so its records cannot "
        f"be re-created exactly once: start the job afresh (delete {layout.job_file}) or "
        "restore the files"
    )


def _intact(disks: Disks | None, ownership: Ownership, key: str) -> bool:
    claim = ownership.get(key)
    expected = disks.tokens.get(key) if disks is not None else None
    return expected is None or claim is None or claim.owner.token == expected


def _cause(disks: Disks | None) -> str:
    if disks is not None and disks.boot_id and disks.boot_id != boot_id():
        return " (the host rebooted since: boot id changed)"
    return " (the files were deleted while the daemon was not running, or just before)"


def _shards_present(layout: Layout) -> set[str]:
    """Shards on the RAM disk: in progress, ready or claimed (not those in ``done/``: their
    trainers finished them, and the supervisor notes them delivered and deletes them)."""
    present = set()
    for directory in (layout.ram_tmp, layout.ram_ready, layout.ram_claimed):
        for name in _names(directory):
            claim = parse_claim_name(name)
            present.add(claim.shard if claim else unpart(name))
    return present


def _losses(
    layout: Layout,
    found: Assessment,
    journals: dict[int, Head],
    cache_ok: bool,
) -> dict[int, str]:
    """Epoch -> what of it was lost (the first loss of each epoch)."""
    losses: dict[int, str] = {}
    for shard, _ in sorted(found.lost.items()):
        parsed = parse_shard_name(shard)
        if parsed is not None and parsed.epoch not in losses:
            shards = [s for s in found.lost if s.startswith(epoch_prefix(parsed.epoch))]
            records = sum(found.lost[s] for s in shards)
            losses[parsed.epoch] = (
                f"output.ram_dir {layout.ram}: {len(shards)} published shards of epoch "
                f"{parsed.epoch} ({records} records) that no trainer had read are gone"
            )
    for epoch, name in _objects_lost(layout, journals, cache_ok):
        losses.setdefault(
            epoch,
            f"download.cache_dir {layout.cache}: raw object {name} of epoch {epoch}, "
            "partly written into shards, is gone",
        )
    return losses


def _objects_lost(
    layout: Layout, journals: dict[int, Head], cache_ok: bool
) -> Iterable[tuple[int, str]]:
    if not cache_ok:  # emptied: every object of the epochs being downloaded may be gone
        for logged in layout.download_log_epochs():
            if layout.download_log(logged).stat().st_size:
                yield logged, "(all of them: the directory was emptied)"
    claimed = set(_names(layout.cache_claimed))
    for index, (_, head) in journals.items():
        for name in head.positions:
            epoch = file_epoch(name)
            gone = writer_claim_name(index, name) not in claimed and name not in head.finished
            if epoch is not None and gone:
                yield epoch, name


def reset_epochs(layout: Layout, first: int, journals: dict[int, Head]) -> None:
    """Forget epochs ``first`` and later: their files, download logs, ledgers and markers, and
    their objects in the writers' journals, so they are downloaded and written again."""
    for directory in (
        layout.cache_tmp,
        layout.cache_meta,
        layout.cache_ready,
        layout.cache_claimed,
        *layout.ram_shard_dirs,
        layout.download_logs,
        layout.epochs,
        layout.shards,
    ):
        for name in _names(directory):
            epoch = file_epoch(name)
            if epoch is not None and epoch >= first and is_own_file(directory.name, name):
                (directory / name).unlink(missing_ok=True)
    for journal, head in journals.values():
        journal.rewrite(_without_epochs(head, first))


def _without_epochs(head: JournalEntry, first: int) -> JournalEntry:
    def keep(name: str | None) -> bool:
        epoch = file_epoch(name) if name else None
        return epoch is not None and epoch < first

    return JournalEntry(
        shard=head.shard if keep(head.shard) else None,
        counter=head.counter,
        positions={n: p for n, p in head.positions.items() if keep(n)},
        finished=tuple(n for n in head.finished if keep(n)),
    )


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
