"""Every local file name prefetchd makes, and the parsers that recognise them (pure: no I/O).

Local names never come from object keys: an object's name is its epoch, its position in the
epoch's order and a hash of bucket and key, so ``../../etc/passwd`` is just another hash.
A parser returns a named result, or None for a name that is not ours: a start-up sweep
deletes only names these parsers recognise (``is_own_file``, ``is_own_top_name``).
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable
from typing import NamedTuple

from prefetchd.atomic import temp_target

_OBJECT = re.compile(r"e([0-9]{5,})-([0-9]{9,})-([0-9a-f]{24})")
_KEPT = re.compile(r"k-[0-9a-f]{32}")
_SHARD = re.compile(r"e([0-9]{5,})-w([0-9]{2,})-([0-9]{7,})\.tfrecord(\.gz)?")
_LEDGER = re.compile(r"e([0-9]+)\.(?:w([0-9]+)\.log|delivered)")
_JOURNAL = re.compile(r"w([0-9]+)\.log")
_DOWNLOAD_LOG = re.compile(r"e([0-9]+)\.log")
TMP_SUFFIX = ".part"  # a file being written under .tmp/, renamed without it when complete
META_SUFFIX = ".json"  # an object's meta (cache/meta) and a kept object's (cache/keep)
LOCK_SUFFIX = ".lock"  # a trainer's liveness lock (ram/consumers)


class ObjectName(NamedTuple):
    """A raw object's local name, parsed: ``e<epoch>-<seq>-<digest>``."""

    epoch: int
    seq: int
    digest: str


class ShardName(NamedTuple):
    """A shard's name, parsed: ``e<epoch>-w<writer>-<counter>.tfrecord[.gz]``."""

    epoch: int
    writer: int
    counter: int


class ShardClaim(NamedTuple):
    """A claimed shard's name in ``ram/claimed`` or ``ram/done``, parsed:
    ``<claimant>-<shard>``."""

    claimant: str
    shard: str


class LedgerName(NamedTuple):
    """A shard-ledger file's name in ``state/shards``, parsed: ``e<epoch>.w<writer>.log``
    (shards writer ``writer`` published) or ``e<epoch>.delivered`` (``writer`` None)."""

    epoch: int
    writer: int | None


# --- raw objects (cache_dir) -----------------------------------------------------------------


def key_hash(bucket: str, key: str) -> str:
    digest = hashlib.sha256(f"{bucket}\x00{key}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:24]


def mixed_key_hash(source: int, period: int, bucket: str, key: str) -> str:
    """An object's hash in a job of several sources: its source's index and the period of
    that source's stream it is read in are hashed with bucket and key, so the same key in two
    sources, or one object read twice in an epoch, are two names (download/mixture.py)."""
    text = f"{source}\x00{period}\x00{bucket}\x00{key}"
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:24]


def object_name(epoch: int, seq: int, digest: str) -> str:
    return f"e{epoch:05d}-{seq:09d}-{digest}"


@functools.lru_cache(maxsize=4096)
def parse_object_name(name: str) -> ObjectName | None:
    """The parts of a local object name, or None if it is not one of ours. Remembered for
    the last 4096 names: a writer parses each object's name four times (choosing, claiming,
    opening it), each a regex match and two ``int()``; the result is immutable."""
    m = _OBJECT.fullmatch(name)
    if m is None:
        return None
    epoch, seq, digest = m.group(1, 2, 3)  # one call, not three (a miss is once per object)
    return ObjectName(int(epoch), int(seq), digest)


def object_digest(name: str) -> str:
    """The hash of bucket and key that ends an object name: the same object in every epoch."""
    return name.rpartition("-")[2]


def epoch_prefix(epoch: int) -> str:
    """Every object and shard name of ``epoch`` starts with this."""
    return f"e{epoch:05d}-"


def part_name(name: str) -> str:
    """The temp name ``name`` is written under in ``.tmp/`` before it is renamed into place."""
    return name + TMP_SUFFIX


def unpart(name: str) -> str:
    """The name a ``.tmp/`` file will have once complete (``name`` itself if not a temp name)."""
    return name.removesuffix(TMP_SUFFIX)


def is_part(name: str) -> bool:
    return name.endswith(TMP_SUFFIX)


_SPARE = re.compile(r"spare-w[0-9]+-[0-9]+")


def spare_name(writer: int, n: int) -> str:
    """An empty file writer ``writer`` left in ``cache/.tmp`` for the downloader to use again
    (``prefetchd/spares.py``): its ``n``-th, cycling."""
    return f"spare-w{writer}-{n}"


def is_spare(name: str) -> bool:
    return _SPARE.fullmatch(name) is not None


def meta_name(name: str) -> str:
    """The name of an object's meta in ``cache/meta`` (or of a kept object's in ``cache/keep``)."""
    return name + META_SUFFIX


def unmeta(name: str) -> str:
    """The object a meta name belongs to (``name`` itself if it is no meta name)."""
    return name.removesuffix(META_SUFFIX)


def is_meta(name: str) -> bool:
    return name.endswith(META_SUFFIX)


def kept_name(bucket: str, key: str, etag: str, size: int) -> str:
    """The name of a kept object in ``cache/keep``: a hash of its source identity, so the same
    bytes are found again by any job on this cache_dir, and a changed object is another name."""
    identity = f"{bucket}\x00{key}\x00{etag}\x00{size}".encode("utf-8", "surrogatepass")
    return "k-" + hashlib.sha256(identity).hexdigest()[:32]


def parse_kept_name(name: str) -> bool:
    """Whether ``name`` is a kept object's name (``kept_name``)."""
    return _KEPT.fullmatch(name) is not None


def writer_claim_prefix(writer: int) -> str:
    """Every object writer ``writer`` has claimed is named ``<this><obj>`` in ``cache/claimed``."""
    return f"w{writer}-"


def writer_claim_name(writer: int, obj: str) -> str:
    return writer_claim_prefix(writer) + obj


def claimed_object(name: str) -> str | None:
    """The object name inside a writer's claim ``w<i>-<obj>``, or None if ``name`` is not one."""
    writer, sep, obj = name.partition("-")
    index = writer[1:]
    if writer[:1] != "w" or not (index.isascii() and index.isdigit()) or not sep:
        return None
    return obj if parse_object_name(obj) is not None else None


# --- shards (ram_dir) ------------------------------------------------------------------------


def shard_name(epoch: int, writer: int, counter: int, *, gzip: bool = False) -> str:
    return f"e{epoch:05d}-w{writer:02d}-{counter:07d}.tfrecord" + (".gz" if gzip else "")


def parse_shard_name(name: str) -> ShardName | None:
    """The parts of a shard name, or None."""
    m = _SHARD.fullmatch(name)
    return ShardName(int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def claim_name(claimant: str, shard: str) -> str:
    """``claimant`` identifies one trainer process: its pid plus a random tag, because trainers
    in other containers (other PID namespaces) may share the RAM disk."""
    return f"{claimant}-{shard}"


def parse_claim_name(name: str) -> ShardClaim | None:
    """The claimant and shard of a claimed shard's name, or None."""
    claimant, sep, shard = name.partition("-")
    if not sep or not (claimant.isascii() and claimant.isalnum()):
        return None
    return ShardClaim(claimant, shard) if parse_shard_name(shard) is not None else None


def claimed_shard(name: str) -> str:
    """The shard inside a trainer's claim name (what follows the claimant), unchecked: for
    names this process made itself (``claim_name``)."""
    return name.partition("-")[2]


def consumer_lock_name(claimant: str) -> str:
    return claimant + LOCK_SUFFIX


def lock_claimant(name: str) -> str | None:
    """The trainer a ``consumers/`` file is the liveness lock of; None for another name (a
    lock still under its temp name included)."""
    if not name.endswith(LOCK_SUFFIX) or name.startswith("."):
        return None
    return name.removesuffix(LOCK_SUFFIX)


# --- state_dir -------------------------------------------------------------------------------


def child_report_name(child: str) -> str:
    return f"{child}.json"


def child_of_report(name: str) -> str | None:
    """The child whose report ``name`` is, or None (a ``write_atomic`` temp name included)."""
    return name.removesuffix(".json") if name.endswith(".json") else None


def download_log_name(epoch: int) -> str:
    return f"e{epoch}.log"


def download_log_epoch(name: str) -> int | None:
    m = _DOWNLOAD_LOG.fullmatch(name)
    return int(m.group(1)) if m else None


def journal_name(writer: int) -> str:
    return f"w{writer}.log"


def journal_writer(name: str) -> int | None:
    """The writer whose commit journal ``name`` is, or None."""
    m = _JOURNAL.fullmatch(name)
    return int(m.group(1)) if m else None


def parse_attempts_name(writer: int) -> str:
    return f"w{writer}.parsing"


def marker_name(epoch: int, marker: str) -> str:
    """``epochs/<k>.<marker>``: ``downloaded``, ``complete``, ``keep.json`` or ``listing``."""
    return f"{epoch}.{marker}"


def published_ledger_name(epoch: int, writer: int) -> str:
    return f"e{epoch}.w{writer}.log"


def delivered_ledger_name(epoch: int) -> str:
    return f"e{epoch}.delivered"


def parse_ledger_name(name: str) -> LedgerName | None:
    m = _LEDGER.fullmatch(name)
    if m is None:
        return None
    return LedgerName(int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None)


_STATE_EPOCH = re.compile(
    r"e?([0-9]+)\.(log|delivered|downloaded|complete|listing|keep\.json|w[0-9]+\.log)"
)


def file_epoch(name: str) -> int | None:
    """The epoch one of our file names belongs to: an object, a shard, a writer's or a
    trainer's claim (temp suffixes included), or a per-epoch state file (``progress/e<k>.log``,
    ``epochs/<k>.complete``, ``epochs/<k>.listing``, ``epochs/<k>.keep.json``,
    ``shards/e<k>.w<i>.log``); None for any other name."""
    base = unmeta(unpart(name))
    claim = parse_claim_name(base)
    inner = claimed_object(base) or (claim.shard if claim else base)
    parsed = parse_object_name(inner) or parse_shard_name(inner)
    if parsed is not None:
        return parsed.epoch
    m = _STATE_EPOCH.fullmatch(name)
    return int(m.group(1)) if m else None


# --- what a start-up sweep may delete --------------------------------------------------------

OWNER_FILE = "prefetchd.owner"
LOCK_FILE = "prefetchd.lock"
FENCE_FILE = "prefetchd.job"  # ram_dir: the job its shards belong to, locked by its daemon
# Names prefetchd makes directly inside each of its three directories (besides the files
# inside its sub-directories): an existing directory holding anything else is not ours.
OWN_TOP_NAMES = frozenset(
    {
        OWNER_FILE,
        LOCK_FILE,
        FENCE_FILE,
        ".tmp",
        "meta",
        "ready",
        "claimed",
        "done",
        "consumers",
        ".budget.lock",
        "status.json",
        "job.json",
        "disks.json",
        "children",
        "progress",
        "journal",
        "epochs",
        "shards",
    }
)


def is_own_top_name(name: str) -> bool:
    """Whether ``name`` directly inside ram_dir, cache_dir or state_dir is one prefetchd makes
    (a ``write_atomic`` temp file of one of them included)."""
    return name in OWN_TOP_NAMES or temp_target(name) in OWN_TOP_NAMES


def is_own_file(directory: str, name: str) -> bool:
    """Whether ``name`` inside our sub-directory ``directory`` (``ready``, ``journal``, ...) is
    named by our scheme: the start-up sweep deletes these and nothing else."""
    check = _OWN_FILES.get(directory)
    if check is None:
        return False
    return check(name) or check(temp_target(name) or "\x00")


def _own_cache_file(name: str) -> bool:
    return (
        parse_object_name(unpart(name)) is not None
        or parse_object_name(unmeta(name)) is not None
        or claimed_object(name) is not None
    )


def _own_ram_file(name: str) -> bool:
    return parse_shard_name(unpart(name)) is not None or parse_claim_name(name) is not None


_OWN_FILES: dict[str, Callable[[str], bool]] = {
    ".tmp": lambda n: _own_cache_file(n) or _own_ram_file(n) or is_spare(n),
    "meta": _own_cache_file,
    "ready": lambda n: _own_cache_file(n) or _own_ram_file(n),
    "claimed": lambda n: _own_cache_file(n) or _own_ram_file(n),
    "done": _own_ram_file,
    "progress": lambda n: download_log_epoch(n) is not None,
    "journal": lambda n: journal_writer(n) is not None,
    "epochs": lambda n: (
        re.fullmatch(r"[0-9]+\.(downloaded|complete|listing|keep\.json)", n) is not None
    ),
    "shards": lambda n: parse_ledger_name(n) is not None or shard_mix_of(n) is not None,
}


def shard_mix_name(shard: str) -> str:
    """``state_dir/shards/<shard>.mix``: which objects shard ``shard`` holds (``ShardMix``)."""
    return shard + ".mix"


def shard_mix_of(name: str) -> str | None:
    """The shard whose mix file ``name`` is, or None."""
    if not name.endswith(".mix"):
        return None
    shard = name[: -len(".mix")]
    return shard if parse_shard_name(shard) is not None else None
