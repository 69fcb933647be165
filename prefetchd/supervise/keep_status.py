"""``download.keep`` in the status record: the hits and misses per epoch that the downloader
saves in ``state_dir/epochs/<k>.keep.json`` (``messages/epoch_keep.py``)."""

from __future__ import annotations

import os

from prefetchd.layout import Layout
from prefetchd.messages.epoch_keep import EpochKeep, read_epoch_keep

MAX_KEEP_EPOCHS_SHOWN = 8
_SUFFIX = ".keep.json"


def keep_epochs(layout: Layout) -> tuple[EpochKeep, ...]:
    """The figures of the last ``MAX_KEEP_EPOCHS_SHOWN`` epochs that have any, oldest first."""
    try:
        names = os.listdir(layout.epochs)
    except FileNotFoundError:
        return ()
    numbers = sorted(int(n[: -len(_SUFFIX)]) for n in names if _is_figures(n))
    return tuple(
        read_epoch_keep(layout.keep_figures(k), k) for k in numbers[-MAX_KEEP_EPOCHS_SHOWN:]
    )


def _is_figures(name: str) -> bool:
    stem = name[: -len(_SUFFIX)]
    return name.endswith(_SUFFIX) and stem.isascii() and stem.isdigit()
