"""Where the three directories go when the config leaves them ``null``: the one place that
decides.

root keeps the system paths (``/var/cache/prefetchd``, ``/dev/shm/prefetchd``,
``/var/lib/prefetchd``); any other user gets directories of their own, XDG-style, so that
``prefetchd check`` and ``prefetchd run`` work for a normal user with a config that names only
``source.url``:

- ``download.cache_dir``: ``$XDG_CACHE_HOME/prefetchd``, else ``~/.cache/prefetchd``
- ``output.ram_dir``: ``/dev/shm/prefetchd-<uid>``; ``$XDG_RUNTIME_DIR/prefetchd`` only on a
  host without ``/dev/shm``
- ``status.state_dir``: ``$XDG_STATE_HOME/prefetchd``, else ``~/.local/state/prefetchd``

The RAM directory is named by uid rather than taken from ``$XDG_RUNTIME_DIR`` first because
the trainer must resolve the same path as the daemon, and ``$XDG_RUNTIME_DIR`` is unset in
containers, under ``su`` and in many batch jobs, while the uid is the same everywhere; it is
also usually a tenth of RAM, smaller than ``/dev/shm``. The daemon and its trainers must run as
the same user with the same ``XDG_*`` variables, or name the directories in the config.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_CACHE_DIR = Path("/var/cache/prefetchd")
ROOT_RAM_DIR = Path("/dev/shm/prefetchd")
ROOT_STATE_DIR = Path("/var/lib/prefetchd")
SHM = Path("/dev/shm")


def default_cache_dir() -> Path:
    """``download.cache_dir`` when the config gives none."""
    if _is_root():
        return ROOT_CACHE_DIR
    return _xdg("XDG_CACHE_HOME", ".cache") / "prefetchd"


def default_ram_dir() -> Path:
    """``output.ram_dir`` when the config gives none."""
    if _is_root():
        return ROOT_RAM_DIR
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if not SHM.is_dir() and os.path.isabs(runtime):
        return Path(runtime) / "prefetchd"
    return SHM / f"prefetchd-{os.geteuid()}"


def default_state_dir() -> Path:
    """``status.state_dir`` when the config gives none."""
    if _is_root():
        return ROOT_STATE_DIR
    return _xdg("XDG_STATE_HOME", ".local/state") / "prefetchd"


def _is_root() -> bool:
    return os.geteuid() == 0


def _xdg(variable: str, fallback: str) -> Path:
    """The XDG base directory ``variable`` names, or ``~/<fallback>``. A relative value is
    ignored, as the XDG spec says it must be."""
    value = os.environ.get(variable, "")
    if os.path.isabs(value):
        return Path(value)
    return Path.home() / fallback
