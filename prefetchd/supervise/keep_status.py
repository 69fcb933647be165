"""``download.keep`` in the status record: the hit ratio, and the hits and misses per epoch that
the downloader saves in ``state_dir/epochs/<k>.keep.json`` (``download/keeper.py``)."""

from __future__ import annotations

import os

from prefetchd.download.keeper import read_epoch_keep
from prefetchd.layout import Layout
from prefetchd.supervise.status_record import KeepEpoch

MAX_KEEP_EPOCHS_SHOWN = 8
_SUFFIX = ".keep.json"


def hit_ratio(hit_bytes: int, miss_bytes: int) -> float | None:
    """The share of bytes served from kept copies; None before any object was served."""
    total = hit_bytes + miss_bytes
    return round(hit_bytes / total, 4) if total else None


def keep_epochs(layout: Layout) -> tuple[KeepEpoch, ...]:
    """The figures of the last ``MAX_KEEP_EPOCHS_SHOWN`` epochs that have any, oldest first."""
    try:
        names = os.listdir(layout.epochs)
    except FileNotFoundError:
        return ()
    numbers = sorted(int(n[: -len(_SUFFIX)]) for n in names if _is_figures(n))
    return tuple(_epoch(layout, k) for k in numbers[-MAX_KEEP_EPOCHS_SHOWN:])


def _is_figures(name: str) -> bool:
    stem = name[: -len(_SUFFIX)]
    return name.endswith(_SUFFIX) and stem.isascii() and stem.isdigit()


def _epoch(layout: Layout, epoch: int) -> KeepEpoch:
    f = read_epoch_keep(layout.keep_figures(epoch))
    ratio = hit_ratio(f.hit_bytes, f.miss_bytes)
    return KeepEpoch(epoch, f.hits, f.hit_bytes, f.misses, f.miss_bytes, ratio)
