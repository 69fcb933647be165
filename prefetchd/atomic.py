"""Private directories and files that appear whole: the helpers every process writes with.

A reader never sees a partial file: ``write_atomic`` publishes by temp name + rename, and its
temp name ``.<name>.<pid>.tmp`` is the one local name not made by ``layout``, because any file
may be written through it; ``temp_target`` tells a start-up sweep which file a temp name stood
for. Directories are created 0700 and refused when another user could redirect them; files are
created ``O_EXCL | O_NOFOLLOW``, 0600.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from prefetchd.errors import RuntimeFailure


def temp_name(path: Path) -> Path:
    """Where ``write_atomic`` writes ``path`` before renaming it into place."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def temp_target(name: str) -> str | None:
    """The file a ``write_atomic`` temp name ``.<name>.<pid>.tmp`` stands for, or None."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    stem, _, pid = name[1:-4].rpartition(".")
    return stem if pid.isdigit() else None


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
    tmp = temp_name(path)
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
    (a meta before its object's download-log line). Saves write_atomic's rename, the dearest
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
