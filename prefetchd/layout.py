"""Where everything lives on disk, and how local names are made.

Local file names never come from object keys: an object's name is its epoch, its position in
the epoch's order and a hash of bucket and key, so ``../../etc/passwd`` is just another hash.
Every directory is created private (0700) and every file is created with ``O_EXCL``.

Each of the three directories also holds ``prefetchd.owner`` (which daemon owns it: config,
state_dir, pid, boot id, and a token naming this incarnation of the directory) and
``prefetchd.lock`` (flocked by the supervisor for its whole life); ``owner.py`` writes both.
A start-up sweep deletes only names this module recognises as ours.

::

    download.cache_dir/
        prefetchd.owner, prefetchd.lock   (also in ram_dir and state_dir)
        .tmp/<obj>.part           download in progress (swept at start-up)
        meta/<obj>.json           key, size, etag of a published object
        ready/<obj>               complete, verified raw objects; writers claim by rename
        claimed/w<i>-<obj>        owned by writer i until its records are in published shards
        keep/<id>.json            download.keep: key, etag, size, crc32c of a kept object
        keep/<id>                 the kept bytes (a hard link to the verified download)
    output.ram_dir/
        .tmp/<shard>.part         shard being written (size includes the budget reservation)
        ready/<shard>             complete shards; trainers claim by rename
        claimed/<owner>-<shard>   claimed by trainer process <owner>; moved to done/ once read
        done/<owner>-<shard>      read by its trainer: the supervisor notes it delivered and
                                  deletes it (freeing a shard's pages costs ~0.2 CPU-s/GB,
                                  paid by the daemon, not the trainer)
        consumers/<owner>.lock    held (flock) by trainer process <owner> while it lives
        .budget.lock              serializes RAM reservations between writers
    status.state_dir/
        prefetchd.lock            held (flock) by the running daemon
        status.json               the status record (0600), rewritten about once a second
        job.json                  the fingerprint of the job the state below belongs to
        children/<child>.json     each child's counters and heartbeat
        progress/e<k>.log         hashes of objects the downloader published in epoch k
        journal/w<i>.log          writer i's shard commits (what each shard consumed)
        journal/w<i>.parsing      the object writer i's format plugin reads now (write/attempts.py)
        epochs/<k>.downloaded     epoch k fully downloaded (written by the downloader)
        epochs/<k>.complete       every shard of epoch k published (written by the supervisor)
        epochs/<k>.keep.json      download.keep's hits and misses in epoch k (the downloader)
        disks.json                the incarnation (token, boot id) of ram_dir and cache_dir
                                  this state describes (written by the supervisor)
        shards/e<k>.w<i>.log      shards of epoch k writer i published (the ledger, ledger.py)
        shards/e<k>.delivered     shards of epoch k trainers finished (written by the supervisor)
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prefetchd.config import Config
from prefetchd.errors import RuntimeFailure

_OBJECT = re.compile(r"e([0-9]{5,})-([0-9]{9,})-([0-9a-f]{24})")
_KEPT = re.compile(r"k-[0-9a-f]{32}")
_SHARD = re.compile(r"e([0-9]{5,})-w([0-9]{2,})-([0-9]{7,})\.tfrecord(\.gz)?")
TMP_SUFFIX = ".part"


def key_hash(bucket: str, key: str) -> str:
    digest = hashlib.sha256(f"{bucket}\x00{key}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:24]


def object_name(epoch: int, seq: int, digest: str) -> str:
    return f"e{epoch:05d}-{seq:09d}-{digest}"


def parse_object_name(name: str) -> tuple[int, int, str] | None:
    """``(epoch, seq, hash)`` of a local object name, or None if it is not one of ours."""
    m = _OBJECT.fullmatch(name)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def kept_name(bucket: str, key: str, etag: str, size: int) -> str:
    """The name of a kept object in ``cache/keep``: a hash of its source identity, so the same
    bytes are found again by any job on this cache_dir, and a changed object is another name."""
    identity = f"{bucket}\x00{key}\x00{etag}\x00{size}".encode("utf-8", "surrogatepass")
    return "k-" + hashlib.sha256(identity).hexdigest()[:32]


def parse_kept_name(name: str) -> bool:
    """Whether ``name`` is a kept object's name (``kept_name``)."""
    return _KEPT.fullmatch(name) is not None


def epoch_prefix(epoch: int) -> str:
    """Every object and shard name of ``epoch`` starts with this."""
    return f"e{epoch:05d}-"


def shard_name(epoch: int, writer: int, counter: int, *, gzip: bool = False) -> str:
    return f"e{epoch:05d}-w{writer:02d}-{counter:07d}.tfrecord" + (".gz" if gzip else "")


def parse_shard_name(name: str) -> tuple[int, int, int] | None:
    """``(epoch, writer, counter)`` of a shard name, or None."""
    m = _SHARD.fullmatch(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


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


_STATE_EPOCH = re.compile(r"e?([0-9]+)\.(log|delivered|downloaded|complete|w[0-9]+\.log)")


def file_epoch(name: str) -> int | None:
    """The epoch one of our file names belongs to: an object, a shard, a writer's or a
    trainer's claim (temp suffixes included), or a per-epoch state file (``progress/e<k>.log``,
    ``epochs/<k>.complete``, ``shards/e<k>.w<i>.log``); None for any other name."""
    base = name.removesuffix(TMP_SUFFIX).removesuffix(".json")
    claim = parse_claim_name(base)
    inner = claimed_object(base) or (claim[1] if claim else base)
    parsed = parse_object_name(inner) or parse_shard_name(inner)
    if parsed is not None:
        return parsed[0]
    m = _STATE_EPOCH.fullmatch(name)
    return int(m.group(1)) if m else None


def claim_name(owner: str, shard: str) -> str:
    """``owner`` identifies one trainer process: its pid plus a random tag, because trainers in
    other containers (other PID namespaces) may share the RAM disk."""
    return f"{owner}-{shard}"


def parse_claim_name(name: str) -> tuple[str, str] | None:
    """``(owner, shard)`` of a claimed shard's name, or None."""
    owner, sep, shard = name.partition("-")
    if not sep or not (owner.isascii() and owner.isalnum()) or parse_shard_name(shard) is None:
        return None
    return owner, shard


@dataclass(frozen=True)
class Layout:
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

    # ram_dir
    @property
    def ram_tmp(self) -> Path:
        return self.ram / ".tmp"

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

    def consumer_lock(self, owner: str) -> Path:
        return self.ram_consumers / f"{owner}.lock"

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
    def children(self) -> Path:
        return self.state / "children"

    @property
    def progress(self) -> Path:
        return self.state / "progress"

    @property
    def journal(self) -> Path:
        return self.state / "journal"

    @property
    def epochs(self) -> Path:
        return self.state / "epochs"

    @property
    def disks_file(self) -> Path:
        return self.state / "disks.json"

    @property
    def shards(self) -> Path:
        return self.state / "shards"

    def published_ledger(self, epoch: int, writer: int) -> Path:
        return self.shards / f"e{epoch}.w{writer}.log"

    def delivered_ledger(self, epoch: int) -> Path:
        return self.shards / f"e{epoch}.delivered"

    def downloaded_marker(self, epoch: int) -> Path:
        return self.epochs / f"{epoch}.downloaded"

    def complete_marker(self, epoch: int) -> Path:
        return self.epochs / f"{epoch}.complete"

    def keep_figures(self, epoch: int) -> Path:
        return self.epochs / f"{epoch}.keep.json"

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
            self.progress,
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


OWNER_FILE = "prefetchd.owner"
LOCK_FILE = "prefetchd.lock"
# Names prefetchd makes directly inside each of its three directories (besides the files
# inside its sub-directories): an existing directory holding anything else is not ours.
OWN_TOP_NAMES = frozenset(
    {
        OWNER_FILE,
        LOCK_FILE,
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
    return name in OWN_TOP_NAMES or _atomic_temp_of(name) in OWN_TOP_NAMES


def _atomic_temp_of(name: str) -> str | None:
    """The file a ``write_atomic`` temp name ``.<name>.<pid>.tmp`` stands for, or None."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    stem, _, pid = name[1:-4].rpartition(".")
    return stem if pid.isdigit() else None


def is_own_file(directory: str, name: str) -> bool:
    """Whether ``name`` inside our sub-directory ``directory`` (``ready``, ``journal``, ...) is
    named by our scheme: the start-up sweep deletes these and nothing else."""
    check = _OWN_FILES.get(directory)
    if check is None:
        return False
    return check(name) or check(_atomic_temp_of(name) or "\x00")


def _own_cache_file(name: str) -> bool:
    return (
        parse_object_name(name.removesuffix(TMP_SUFFIX)) is not None
        or parse_object_name(name.removesuffix(".json")) is not None
        or claimed_object(name) is not None
    )


def _own_ram_file(name: str) -> bool:
    return (
        parse_shard_name(name.removesuffix(TMP_SUFFIX)) is not None
        or parse_claim_name(name) is not None
    )


_OWN_FILES: dict[str, Callable[[str], bool]] = {
    ".tmp": lambda n: _own_cache_file(n) or _own_ram_file(n),
    "meta": _own_cache_file,
    "ready": lambda n: _own_cache_file(n) or _own_ram_file(n),
    "claimed": lambda n: _own_cache_file(n) or _own_ram_file(n),
    "done": _own_ram_file,
    "progress": lambda n: re.fullmatch(r"e[0-9]+\.log", n) is not None,
    "journal": lambda n: re.fullmatch(r"w[0-9]+\.log", n) is not None,
    "epochs": lambda n: re.fullmatch(r"[0-9]+\.(downloaded|complete)", n) is not None,
    "shards": lambda n: re.fullmatch(r"e[0-9]+\.(w[0-9]+\.log|delivered)", n) is not None,
}


def make_private_dir(path: Path, *, tighten: bool = False) -> bool:
    """Create ``path`` (and parents) with mode 0700, or check an existing one is safe to use;
    True if it was created here.

    Raises ``RuntimeFailure`` naming the directory if it is a symlink, belongs to another user
    or is writable by others: a daemon that writes there could be tricked into clobbering files.
    An existing directory keeps its mode unless ``tighten`` (a directory prefetchd made itself,
    e.g. one of its sub-directories): the mode of a directory someone else made is theirs.
    """
    unsafe = _unsafe_ancestor(path)
    if unsafe:
        raise RuntimeFailure(f"refusing to use {path}: {unsafe}")
    try:
        for parent in reversed(path.parents):  # each missing ancestor private too
            if not parent.exists():
                with contextlib.suppress(FileExistsError):
                    os.mkdir(parent, 0o700)
        os.mkdir(path, 0o700)
        return True
    except FileExistsError:
        pass
    except OSError as exc:
        raise RuntimeFailure(f"cannot create directory {path}: {exc.strerror}") from None
    problem = existing_dir_problem(path)
    if problem:
        raise RuntimeFailure(problem)
    if tighten and os.lstat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return False


def dir_problem(path: Path) -> str | None:
    """Why ``make_private_dir(path)`` would refuse ``path``, without changing anything (for
    ``prefetchd check``); None if it would create or accept it."""
    unsafe = _unsafe_ancestor(path)
    if unsafe:
        return f"refusing to use {path}: {unsafe}"
    if not os.path.lexists(path):
        return None
    return existing_dir_problem(path)


def existing_dir_problem(path: Path) -> str | None:
    try:
        info = os.lstat(path)
    except OSError as exc:  # e.g. a parent is a regular file
        return f"cannot create directory {path}: {exc.strerror}"
    if stat.S_ISLNK(info.st_mode):
        return f"refusing to use {path}: it is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return f"refusing to use {path}: it is not a directory"
    if info.st_uid != os.geteuid():
        return f"refusing to use {path}: it belongs to another user (uid {info.st_uid})"
    if info.st_mode & 0o022:
        return f"refusing to use {path}: it is writable by other users"
    return None


def _unsafe_ancestor(path: Path) -> str | None:
    """Why another user could redirect ``path`` through one of its existing ancestors, or None.

    In a directory others may write to (``/dev/shm``, ``/tmp``), anyone can plant a name: a
    symlink to a directory of theirs, or a directory they own and can later swap. So every
    name we pass through there must belong to us or root, and such a directory needs the
    sticky bit (else even our own names can be replaced). Symlinks elsewhere, e.g.
    ``/var/run -> /run``, are followed: only root or we could have made them.
    """
    current = Path(path.anchor or "/")
    for part in path.absolute().parts[1:-1]:
        try:
            parent = os.stat(current)
        except (FileNotFoundError, NotADirectoryError):
            return None  # from here on we create everything, 0700
        shared = parent.st_mode & 0o002  # group-writable ancestors are trusted to the group
        if shared and not parent.st_mode & stat.S_ISVTX:
            return f"{current} is writable by other users and not sticky"
        try:
            info = os.lstat(current / part)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError:  # another user's private directory on the way
            return f"permission denied: {current} (uid {parent.st_uid}) is private to its owner"
        if shared and info.st_uid not in (0, os.geteuid()):
            kind = "a symlink" if stat.S_ISLNK(info.st_mode) else "a directory"
            return (
                f"{current / part} is {kind} in the shared directory {current} that belongs "
                f"to another user (uid {info.st_uid})"
            )
        current = Path(os.path.realpath(current / part))
    return None


def write_atomic(path: Path, data: bytes, *, fsync: bool = False) -> None:
    """Publish ``data`` at ``path`` by temp file + rename; readers never see a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            # Plain writes on the fd, not a file object: one is written per published object,
            # and os.fdopen's buffered file costs two syscalls (fstat, lseek) and ~10 us more.
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_new(path: str | Path, data: bytes) -> bool:
    """Create ``path`` (0600, never through a symlink) holding ``data``, without a temp name;
    False, writing nothing, if it exists. Only for a file no reader opens before a later step
    publishes it, so that a crash can leave it partial only where a start-up sweep removes it
    (a meta before its object's progress-log line). Saves write_atomic's rename, the dearest
    of its syscalls. An existing file may be open in a reader: replace it with write_atomic."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return False
    try:
        write_all(fd, data)
    finally:
        os.close(fd)
    return True


def read_small(path: str | Path, hint: int = 4096) -> bytes:
    """The whole of a small file (a meta, a marker) in as few syscalls as the kernel allows:
    open, one read of ``hint`` bytes (a regular file's read is short only at its end), close.
    Path.read_text would also fstat, lseek and build a text wrapper, per object."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks = [os.read(fd, hint)]
        while len(chunks[-1]) == hint:  # longer than the hint: read on to the end
            chunks.append(os.read(fd, hint))
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` at ``fd``'s offset (``os.write`` may write less than asked)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def create_exclusive(path: Path, *, readable: bool = False) -> int:
    """Open a new private file for writing; never follows or reuses an existing name."""
    access = os.O_RDWR if readable else os.O_WRONLY
    return os.open(path, access | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def open_append(path: Path) -> int:
    """Open a private log for appending (created 0600 if missing); never follows a symlink.
    Logs are appended to across restarts, so unlike other files they may already exist."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, 0o600)


def dir_bytes(*dirs: Path) -> int:
    """Total size of the regular files directly inside ``dirs`` (missing files are skipped)."""
    total = 0
    for d in dirs:
        try:
            with os.scandir(d) as it:
                for entry in it:
                    try:
                        if entry.is_file(follow_symlinks=False):
                            total += entry.stat(follow_symlinks=False).st_size
                    except FileNotFoundError:
                        continue
        except FileNotFoundError:
            continue
    return total


def holds_lock(path: Path) -> bool:
    """Whether some live process holds the flock on ``path`` (a trainer's liveness lock)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
