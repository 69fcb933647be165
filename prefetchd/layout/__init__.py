"""Where everything lives on disk: this package makes every local file and directory name.

``Layout`` gives the path of every directory and per-epoch or per-writer file; ``names`` makes
and parses the file names themselves (pure functions with named results). No other module
composes a local name; the one exception is ``write_atomic``'s temp name (``atomic.py``).
Every directory is created private (0700) and every file is created with ``O_EXCL``.

Each of the three directories also holds ``prefetchd.owner`` (which daemon owns it: config,
state_dir, pid, boot id, and a token naming this incarnation of the directory) and
``prefetchd.lock`` (flocked by the supervisor for its whole life); ``owner.py`` writes both.
A start-up sweep deletes only names ``names.is_own_file`` recognises as ours.

::

    download.cache_dir/
        prefetchd.owner, prefetchd.lock   (also in ram_dir and state_dir)
        .tmp/<obj>.part           download in progress (swept at start-up)
        meta/<obj>.json           key, size, etag of a published object
        ready/<obj>               complete, verified raw objects; writers claim by rename
        claimed/w<i>-<obj>        held by writer i until its records are in published shards
        keep/<id>.json            download.keep: key, etag, size, crc32c of a kept object
        keep/<id>                 the kept bytes (a hard link to the verified download)
    output.ram_dir/
        .tmp/<shard>.part         shard being written (size includes the budget reservation)
        ready/<shard>             complete shards; trainers claim by rename
        claimed/<claimant>-<shard>  claimed by trainer process <claimant>; moved to done/ once read
        done/<claimant>-<shard>   read by its trainer: the supervisor notes it delivered and
                                  deletes it (freeing a shard's pages costs ~0.2 CPU-s/GB,
                                  paid by the daemon, not the trainer)
        consumers/<claimant>.lock  held (flock) by trainer process <claimant> while it lives
        prefetchd.job             the job fence: the job whose shards these are, flocked by its
                                  daemon; trainers claim only under it (fence.py)
        .budget.lock              serializes RAM reservations between writers
    status.state_dir/
        prefetchd.lock            held (flock) by the running daemon
        status.json               the status record (0600), rewritten about once a second
        job.json                  the job the state below belongs to: its id, fingerprint
                                  (supervise/job.py)
        children/<child>.json     each child's counters and heartbeat
        progress/e<k>.log         the download log: objects the downloader published
                                  ("P") or skipped ("S") in epoch k (exactly_once)
        journal/w<i>.log          writer i's commit journal (exactly_once/journal.py)
        journal/w<i>.parsing      the object writer i's format plugin reads now (write/attempts.py)
        epochs/<k>.downloaded     epoch k fully downloaded (written by the downloader)
        epochs/<k>.complete       every shard of epoch k published (written by the supervisor)
        epochs/<k>.keep.json      download.keep's hits and misses in epoch k (the downloader)
        epochs/<k>.listing        the listing epoch k's order is over: this host's share's
                                  count and digest (the downloader; trained_objects.ListingId)
        disks.json                the incarnation (token, boot id) of ram_dir and cache_dir
                                  this state describes (written by the supervisor)
        shards/e<k>.w<i>.log      shards of epoch k writer i published (the shard ledger,
                                  exactly_once/ledger.py)
        shards/e<k>.delivered     shards of epoch k trainers finished (written by the supervisor)
        shards/<shard>.mix        which objects <shard> holds, record by record (written by its
                                  writer before the commit; messages/shard_mix.py)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prefetchd.atomic import make_private_dir
from prefetchd.config import Config
from prefetchd.layout.names import (
    FENCE_FILE,
    LOCK_FILE,
    OWN_TOP_NAMES,
    OWNER_FILE,
    TMP_SUFFIX,
    LedgerName,
    ObjectName,
    ShardClaim,
    ShardName,
    child_of_report,
    child_report_name,
    claim_name,
    claimed_object,
    claimed_shard,
    consumer_lock_name,
    delivered_ledger_name,
    download_log_epoch,
    download_log_name,
    epoch_prefix,
    file_epoch,
    is_meta,
    is_own_file,
    is_own_top_name,
    is_part,
    is_spare,
    journal_name,
    journal_writer,
    kept_name,
    key_hash,
    lock_claimant,
    marker_name,
    meta_name,
    mixed_key_hash,
    object_digest,
    object_name,
    parse_attempts_name,
    parse_claim_name,
    parse_kept_name,
    parse_ledger_name,
    parse_object_name,
    parse_shard_name,
    part_name,
    published_ledger_name,
    shard_mix_name,
    shard_mix_of,
    shard_name,
    spare_name,
    unmeta,
    unpart,
    writer_claim_name,
    writer_claim_prefix,
)

__all__ = [
    "COMPLETE",
    "DOWNLOADED",
    "FENCE_FILE",
    "KEEP_FIGURES",
    "LOCK_FILE",
    "OWNER_FILE",
    "OWN_TOP_NAMES",
    "TMP_SUFFIX",
    "Layout",
    "LedgerName",
    "ObjectName",
    "ShardClaim",
    "ShardName",
    "child_of_report",
    "child_report_name",
    "claim_name",
    "claimed_object",
    "claimed_shard",
    "consumer_lock_name",
    "delivered_ledger_name",
    "download_log_epoch",
    "download_log_name",
    "epoch_prefix",
    "file_epoch",
    "is_meta",
    "is_own_file",
    "is_own_top_name",
    "is_part",
    "is_spare",
    "journal_name",
    "journal_writer",
    "kept_name",
    "key_hash",
    "lock_claimant",
    "marker_name",
    "meta_name",
    "mixed_key_hash",
    "object_digest",
    "object_name",
    "parse_attempts_name",
    "parse_claim_name",
    "parse_kept_name",
    "parse_ledger_name",
    "parse_object_name",
    "parse_shard_name",
    "part_name",
    "published_ledger_name",
    "shard_mix_name",
    "shard_mix_of",
    "shard_name",
    "spare_name",
    "unmeta",
    "unpart",
    "writer_claim_name",
    "writer_claim_prefix",
]

DOWNLOADED, COMPLETE, KEEP_FIGURES = "downloaded", "complete", "keep.json"  # epochs/<k>.<this>
LISTING = "listing"  # epochs/<k>.listing


@dataclass(frozen=True)
class Layout:
    """The three directories of one daemon and the path of everything in them."""

    cache: Path
    ram: Path
    state: Path

    @classmethod
    def of(cls, config: Config) -> Layout:
        return cls(config.download.cache_dir, config.output.ram_dir, config.status.state_dir)

    # cache_dir (the four the downloader and writers name per object: joined once, not each time)
    @functools.cached_property
    def cache_tmp(self) -> Path:
        return self.cache / ".tmp"

    @functools.cached_property
    def cache_meta(self) -> Path:
        return self.cache / "meta"

    @functools.cached_property
    def cache_ready(self) -> Path:
        return self.cache / "ready"

    @functools.cached_property
    def cache_claimed(self) -> Path:
        return self.cache / "claimed"

    @property
    def cache_keep(self) -> Path:
        return self.cache / "keep"

    def download_part(self, obj: str) -> Path:
        """Where object ``obj`` is downloaded before it is published into ``ready/``."""
        return self.cache_tmp / part_name(obj)

    @functools.cached_property
    def _meta_text(self) -> str:
        return f"{self.cache_meta}/"

    def meta_file(self, obj: str) -> str:
        """Object ``obj``'s meta, as text: it is opened per object, and a pathlib join and its
        ``str()`` cost more than the syscall."""
        return self._meta_text + meta_name(obj)

    def writer_claims(self, writer: int) -> str:
        """Text that, followed by an object's name, is where writer ``writer`` holds it."""
        return f"{self.cache_claimed}/{writer_claim_prefix(writer)}"

    # ram_dir
    @property
    def ram_tmp(self) -> Path:
        return self.ram / ".tmp"

    def shard_part(self, shard: str) -> Path:
        """Where ``shard`` is written before it is published into ``ready/``."""
        return self.ram_tmp / part_name(shard)

    @property
    def ram_ready(self) -> Path:
        return self.ram / "ready"

    @property
    def ram_claimed(self) -> Path:
        return self.ram / "claimed"

    @property
    def ram_done(self) -> Path:
        return self.ram / "done"

    @property
    def ram_consumers(self) -> Path:
        return self.ram / "consumers"

    def consumer_lock(self, claimant: str) -> Path:
        return self.ram_consumers / consumer_lock_name(claimant)

    def consumer_locks(self) -> dict[str, Path]:
        """Every trainer's liveness lock in ``consumers/``, by claimant."""
        return {
            claimant: self.ram_consumers / name
            for name in _names(self.ram_consumers)
            if (claimant := lock_claimant(name)) is not None
        }

    def consumer_lock_temp(self, claimant: str) -> Path:
        """The lock's name while its trainer locks it, before it is renamed into place."""
        return self.ram_consumers / f".{consumer_lock_name(claimant)}.tmp"

    @property
    def budget_lock(self) -> Path:
        return self.ram / ".budget.lock"

    # state_dir
    @property
    def daemon_lock(self) -> Path:
        return self.state / "prefetchd.lock"

    @property
    def status_file(self) -> Path:
        return self.state / "status.json"

    @property
    def job_file(self) -> Path:
        return self.state / "job.json"

    @property
    def job_fence(self) -> Path:
        """``ram_dir/prefetchd.job``: the job whose shards ram_dir holds (``fence.py``)."""
        return self.ram / FENCE_FILE

    @property
    def children(self) -> Path:
        return self.state / "children"

    def child_report(self, child: str) -> Path:
        return self.children / child_report_name(child)

    def child_reports(self) -> dict[str, Path]:
        """Every child's report in ``children/``, by child name."""
        return {
            child: self.children / name
            for name in _names(self.children)
            if (child := child_of_report(name)) is not None
        }

    @property
    def download_logs(self) -> Path:
        """The downloader's logs (one per epoch being downloaded), named ``progress/``."""
        return self.state / "progress"

    def download_log(self, epoch: int) -> Path:
        return self.download_logs / download_log_name(epoch)

    def download_log_epochs(self) -> list[int]:
        """The epochs that have a download log on disk, lowest first."""
        return sorted(_parsed(self.download_logs, download_log_epoch))

    @property
    def journal(self) -> Path:
        return self.state / "journal"

    def journal_file(self, writer: int) -> Path:
        return self.journal / journal_name(writer)

    def journal_files(self) -> dict[int, Path]:
        """Every writer's commit journal on disk, by writer index."""
        return {i: self.journal_file(i) for i in sorted(_parsed(self.journal, journal_writer))}

    def parse_attempts_file(self, writer: int) -> Path:
        return self.journal / parse_attempts_name(writer)

    @property
    def epochs(self) -> Path:
        return self.state / "epochs"

    def downloaded_marker(self, epoch: int) -> Path:
        return self.epochs / marker_name(epoch, DOWNLOADED)

    def complete_marker(self, epoch: int) -> Path:
        return self.epochs / marker_name(epoch, COMPLETE)

    def keep_figures(self, epoch: int) -> Path:
        return self.epochs / marker_name(epoch, KEEP_FIGURES)

    def epoch_listing(self, epoch: int) -> Path:
        return self.epochs / marker_name(epoch, LISTING)

    @property
    def disks_file(self) -> Path:
        return self.state / "disks.json"

    @property
    def shards(self) -> Path:
        return self.state / "shards"

    def published_ledger(self, epoch: int, writer: int) -> Path:
        return self.shards / published_ledger_name(epoch, writer)

    def delivered_ledger(self, epoch: int) -> Path:
        return self.shards / delivered_ledger_name(epoch)

    def shard_mix(self, shard: str) -> Path:
        """Which objects ``shard`` holds (``messages/shard_mix.py``), until the shard is
        delivered (or its epoch's ledger dropped)."""
        return self.shards / shard_mix_name(shard)

    def shard_mixes(self, epoch: int) -> list[Path]:
        """The mix files of epoch ``epoch``'s shards."""
        return [
            self.shards / n
            for n in _names(self.shards)
            if (s := shard_mix_of(n)) is not None and (p := parse_shard_name(s)) and p[0] == epoch
        ]

    def ledger_files(self) -> list[tuple[Path, LedgerName]]:
        """Every file of the shard ledger, parsed, in name order."""
        found = []
        for name in sorted(_names(self.shards)):
            parsed = parse_ledger_name(name)
            if parsed is not None:
                found.append((self.shards / name, parsed))
        return found

    @property
    def ram_shard_dirs(self) -> tuple[Path, Path, Path, Path]:
        """Every directory of ``ram_dir`` a shard's pages can be in: being written, ready,
        claimed, read (until the supervisor deletes it)."""
        return (self.ram_tmp, self.ram_ready, self.ram_claimed, self.ram_done)

    def all_dirs(self) -> list[Path]:
        return [
            self.cache,
            self.cache_tmp,
            self.cache_meta,
            self.cache_ready,
            self.cache_claimed,
            self.cache_keep,
            self.ram,
            *self.ram_shard_dirs,
            self.ram_consumers,
            self.state,
            self.children,
            self.download_logs,
            self.journal,
            self.epochs,
            self.shards,
        ]

    def roots(self) -> list[tuple[str, Path]]:
        """The three directories a daemon owns, by config key (state_dir first: it is locked
        first, so a second run of one config is refused before it touches the others)."""
        return [
            ("status.state_dir", self.state),
            ("output.ram_dir", self.ram),
            ("download.cache_dir", self.cache),
        ]

    def create(self) -> None:
        """Create every directory private (0700), refusing unsafe existing ones. Sub-directories
        are ours and kept 0700; an existing root keeps its mode (the daemon adopts the roots
        first, through ``owner.claim_dirs``, which says which of them it may take)."""
        roots = {path for _, path in self.roots()}
        for path in self.all_dirs():
            make_private_dir(path, tighten=path not in roots)


def _names(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []


def _parsed(directory: Path, parse: Callable[[str], int | None]) -> list[int]:
    return [n for n in map(parse, _names(directory)) if n is not None]
