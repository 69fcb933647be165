"""The epoch markers in ``state_dir/epochs``: files whose existence is the whole message.

``<k>.downloaded``  every object of epoch k is published or skipped (the downloader writes it,
                    holding ``{"objects": <count>}``);
``<k>.complete``    every record of epoch k is in a published shard (the supervisor writes it,
                    holding ``{}``, fsynced).

Markers only ever appear while the daemon runs, in epoch order; only recovery, before any child
starts, deletes those of the epochs it starts again. So the first epoch without a marker is
found by counting up, from 0 or from the last answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from prefetchd.atomic import write_atomic
from prefetchd.layout import Layout


def first_epoch_without(marker: Callable[[int], Path], start: int = 0) -> int:
    """The lowest epoch from ``start`` on whose ``marker`` (``Layout.downloaded_marker`` or
    ``Layout.complete_marker``) does not exist: with ``start`` a previous answer, it is
    the first epoch not yet downloaded, or not yet complete."""
    epoch = start
    while marker(epoch).exists():
        epoch += 1
    return epoch


def mark_downloaded(layout: Layout, epoch: int, objects: int) -> bool:
    """Write epoch ``epoch``'s downloaded marker; False if it was there already."""
    marker = layout.downloaded_marker(epoch)
    if marker.exists():
        return False
    write_atomic(marker, json.dumps({"objects": objects}).encode())
    return True


def mark_complete(layout: Layout, epoch: int) -> None:
    """Write epoch ``epoch``'s complete marker, durable when this returns."""
    write_atomic(layout.complete_marker(epoch), b"{}", fsync=True)
