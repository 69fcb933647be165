"""Can this trainer process use the daemon's directories? One line saying why not, up front.

The daemon creates ``output.ram_dir`` and ``status.state_dir`` private (0700) to its own user,
so a trainer run as another user (or pointed at another user's directories) cannot claim
shards. Without this check it would die on a ``PermissionError`` deep inside the claim loop;
with it, ``ready_files()`` raises ``RuntimeFailure`` naming the directory, its owner and what
to do.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path

from prefetchd.errors import RuntimeFailure
from prefetchd.layout import Layout

_NEEDS = os.R_OK | os.W_OK | os.X_OK


def check_trainer_access(layout: Layout) -> None:
    """Raise ``RuntimeFailure`` if the RAM or state directory exists but this process may not
    use it; a directory not created yet is fine (the daemon may still be starting)."""
    for key, path, needs in (
        ("output.ram_dir", layout.ram, _NEEDS),
        ("status.state_dir", layout.state, os.R_OK | os.X_OK),
    ):
        problem = access_problem(path, needs)
        if problem:
            raise RuntimeFailure(f"{key} {path}: {problem}")


def access_problem(path: Path, needs: int) -> str | None:
    """Why this process cannot use ``path`` (or reach it through an ancestor), or None."""
    target = _deepest_visible(path)
    if target == path.absolute():
        if os.access(path, needs):
            return None
    elif os.access(target, os.X_OK):
        return None  # not created yet; we will be able to look into it when it is
    owner = os.stat(target).st_uid
    me = os.geteuid()
    what = "it" if target == path.absolute() else str(target)
    if owner == me:
        return f"permission denied: {what} is ours but not open to us: check its mode"
    return (
        f"permission denied: {what} belongs to {_user(owner)} and is private to that user; "
        f"run the trainer as {_user(owner)}, the daemon's user, not as {_user(me)}"
    )


def _deepest_visible(path: Path) -> Path:
    """``path`` if this process can stat it, else the nearest ancestor it can stat: either the
    directory that blocks the way (no search permission) or the last one that exists."""
    for candidate in (path.absolute(), *path.absolute().parents):
        try:
            os.stat(candidate)
        except OSError:  # missing, or behind a directory we may not search
            continue
        return candidate
    return Path("/")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
