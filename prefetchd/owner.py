"""One owner per directory (docs/reliability.md, invariant 7): markers and locks on ram_dir,
cache_dir and state_dir.

Each of the three directories holds two files directly inside it:

``prefetchd.lock``
    flocked (exclusive) by the supervisor for the daemon's whole life. A second daemon naming
    the directory, whatever its other settings, cannot take it and is refused with one line
    naming the directory and the owner (exit 1, as a second run of one config always was: the
    config is valid, the host is busy).
``prefetchd.owner``
    JSON naming the owner, rewritten (atomically) at each start::

        {"version": 1, "config": "/etc/prefetchd.yaml", "state_dir": "/var/lib/prefetchd",
         "pid": 1234, "boot_id": "…", "token": "<32 hex>", "created": true}

    ``state_dir`` is the owner's identity (one state_dir is one job, locked like the others).
    ``token`` names this incarnation of the directory's contents: it is kept while the marker
    survives under the same owner and replaced when the marker is gone (a reboot emptied the
    tmpfs, someone deleted the files) or another owner took the directory over. The state_dir
    remembers the tokens it was written against (``disks.json``), so a restarted daemon knows
    whether the files it expects can still be there (``exactly_once/recovery.py``). ``created``
    says whether prefetchd made the directory, and so may tighten its mode; a directory someone
    else made keeps the mode they gave it.

An existing directory is adopted only when it is safe (not a symlink, ours by uid, not writable
by others: ``atomic.existing_dir_problem``) and either carries a marker or holds nothing but
names prefetchd makes; anything else is refused, never wiped. A restart with the same state_dir
after a crash takes its directories back (the lock of a dead process is free). A directory
whose previous owner (another state_dir) is not running is taken over with a warning: that
owner's files there are swept, and if it is ever restarted it finds its token replaced and
re-creates or fails loudly, never quietly short.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prefetchd.atomic import dir_problem, make_private_dir, write_atomic
from prefetchd.config import Config
from prefetchd.errors import RuntimeFailure
from prefetchd.layout import LOCK_FILE, OWNER_FILE, Layout, is_own_top_name

log = logging.getLogger(__name__)

MARKER_VERSION = 1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
BOOT_ID_ENV = "PREFETCHD_BOOT_ID_FILE"  # tests point it at a file to fake a reboot


def boot_id() -> str:
    """This boot's id (the kernel's; or the file ``$PREFETCHD_BOOT_ID_FILE`` names, in tests);
    "" if it cannot be read."""
    source = Path(os.environ.get(BOOT_ID_ENV) or BOOT_ID)
    try:
        return source.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


@dataclass(frozen=True)
class Owner:
    """What ``prefetchd.owner`` says (see the module)."""

    config: str | None
    state_dir: str
    pid: int
    boot_id: str
    token: str
    created: bool

    def to_json(self) -> dict[str, Any]:
        return {"version": MARKER_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, raw: Any) -> Owner | None:
        """The marker, or None if it is not one this version can read."""
        if not isinstance(raw, dict) or raw.get("version") != MARKER_VERSION:
            return None
        try:
            return cls(
                config=None if raw["config"] is None else str(raw["config"]),
                state_dir=str(raw["state_dir"]),
                pid=int(raw["pid"]),
                boot_id=str(raw["boot_id"]),
                token=str(raw["token"]),
                created=bool(raw["created"]),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        return f"config {self.config or '(unknown)'}, pid {self.pid}"


def read_owner(directory: Path) -> Owner | None:
    """The marker in ``directory``, or None (none, unreadable, or not a marker)."""
    try:
        raw = json.loads((directory / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return Owner.from_json(raw)


@dataclass
class Claim:
    """One directory this daemon owns: ``previous`` is the marker it found (None: new or
    emptied), ``owner`` the one it wrote; ``fd`` holds the lock."""

    key: str
    path: Path
    fd: int
    previous: Owner | None
    owner: Owner

    @property
    def rebooted(self) -> bool:
        """Whether the marker found was written in an earlier boot of this host."""
        return self.previous is not None and self.previous.boot_id != self.owner.boot_id

    def intact(self) -> bool:
        """Whether the directory still carries our marker (an emptied tmpfs does not)."""
        found = read_owner(self.path)
        return found is not None and found.token == self.owner.token


class Ownership:
    """The locks and markers of a running daemon's directories (released by ``close``)."""

    def __init__(self, claims: list[Claim]) -> None:
        self.claims = claims

    def __iter__(self) -> Iterator[Claim]:
        return iter(self.claims)

    def get(self, key: str) -> Claim | None:
        return next((c for c in self.claims if c.key == key), None)

    def tokens(self) -> dict[str, str]:
        return {c.key: c.owner.token for c in self.claims}

    def close(self) -> None:
        for claim in self.claims:
            os.close(claim.fd)
        self.claims = []


def claim_dirs(layout: Layout, config: Config) -> Ownership:
    """Lock and mark ram_dir, cache_dir and state_dir, creating the missing ones (0700).

    Raises ``RuntimeFailure`` (exit 1) with one line naming the directory: another daemon holds
    it (its config and pid), it is not safe to use, or it holds files prefetchd did not make.
    """
    claims: list[Claim] = []
    try:
        for key, path in layout.roots():
            if any(c.path == path for c in claims):
                continue  # one directory named twice: one lock, one marker
            claims.append(_claim(key, path, config, layout.state))
    except BaseException:
        Ownership(claims).close()
        raise
    return Ownership(claims)


def _claim(key: str, path: Path, config: Config, state: Path) -> Claim:
    created = make_private_dir(path)
    previous = read_owner(path)
    if not created and previous is None:
        _refuse_foreign(key, path)
    fd = _lock(key, path, previous)
    try:
        current = _new_owner(config, state, previous, created)
        if previous is not None and previous.state_dir != current.state_dir:
            log.warning(
                "%s %s: taking it over from a prefetchd that is not running (%s, state_dir %s)",
                key,
                path,
                previous.describe(),
                previous.state_dir,
            )
        write_atomic(path / OWNER_FILE, json.dumps(current.to_json()).encode(), fsync=True)
    except BaseException:
        os.close(fd)
        raise
    return Claim(key, path, fd, previous, current)


def _new_owner(config: Config, state: Path, previous: Owner | None, created: bool) -> Owner:
    """Our marker: the token carries over only from our own surviving marker (same state_dir),
    because only then are the files the token stands for still the ones our state describes."""
    same = previous is not None and previous.state_dir == str(state)
    return Owner(
        config=str(config.path) if config.path else None,
        state_dir=str(state),
        pid=os.getpid(),
        boot_id=boot_id(),
        token=previous.token if same and previous is not None else secrets.token_hex(16),
        created=created or (previous is not None and previous.created),
    )


def _refuse_foreign(key: str, path: Path) -> None:
    """An existing directory without our marker is ours only if it holds nothing but our names
    (empty, or left by a release that wrote no marker)."""
    foreign = foreign_entry(path)
    if foreign is not None:
        raise RuntimeFailure(
            f"refusing to use {key} {path}: it is not empty and was not made by prefetchd "
            f"(it holds {foreign!r}); name an empty or new directory"
        )


def foreign_entry(path: Path) -> str | None:
    """The first name directly in ``path`` that prefetchd does not make, or None."""
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        return None
    return next((n for n in names if not is_own_top_name(n)), None)


def _lock(key: str, path: Path, previous: Owner | None) -> int:
    lock = path / LOCK_FILE
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        holder = previous.describe() if previous else _pid_in(lock)
        raise RuntimeFailure(
            f"another prefetchd is already running with {key} {path} ({holder})"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _pid_in(lock: Path) -> str:
    """The holder as the lock file names it (a release that wrote no marker)."""
    with contextlib.suppress(OSError, ValueError):
        return f"pid {int(lock.read_text(encoding='ascii').split()[0])}"
    return "pid unknown"


def held_by(path: Path) -> Owner | None:
    """The owner of ``path`` if a live daemon holds its lock now, else None (for ``check``)."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return read_owner(path) or Owner(None, "", 0, "", "", False)
    finally:
        os.close(fd)
    return None


def dir_findings(layout: Layout) -> Iterator[tuple[str, str]]:
    """What ``claim_dirs`` would refuse, without changing anything: ``(level, message)`` pairs
    for ``prefetchd check`` ("fail", or "ok" for a directory its own daemon holds)."""
    for key, path in layout.roots():
        problem = dir_problem(path)
        if problem:
            yield "fail", f"{key}: {problem}"
            continue
        yield from _ownership_finding(key, path, str(layout.state))


def _ownership_finding(key: str, path: Path, state: str) -> Iterator[tuple[str, str]]:
    if not path.is_dir():
        return
    holder = held_by(path)
    if holder is not None and holder.state_dir == state:
        yield "ok", f"{key} {path} is held by this config's running daemon ({holder.describe()})"
    elif holder is not None:
        yield (
            "fail",
            f"another prefetchd is already running with {key} {path} ({holder.describe()})",
        )
    elif read_owner(path) is None and foreign_entry(path) is not None:
        yield (
            "fail",
            f"refusing to use {key} {path}: it is not empty and was not made by prefetchd "
            f"(it holds {foreign_entry(path)!r}); name an empty or new directory",
        )
