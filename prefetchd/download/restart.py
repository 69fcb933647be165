"""What the downloader does at start-up with what a previous run left in the cache.

A ``.part`` whose hash is in its epoch's download log is rolled forward (renamed into
``ready/``: it was published but for the rename); any other is deleted and fetched again. A meta
without its object is deleted (written early for a fetch that never finished), unless the object
is logged: then it was published and deleted from ``ready/`` before any writer read it (writers
delete the meta first), and it is fetched again under the same name, counted in
``objects_refetched``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Container, Mapping, Set

from prefetchd.exactly_once.download_log import DownloadLog
from prefetchd.layout import Layout, is_part, parse_object_name, unmeta, unpart

log = logging.getLogger(__name__)

Logged = Mapping[int, Set[str]]  # epoch -> the hashes its download log holds


def read_logs(download_log: DownloadLog) -> dict[int, set[str]]:
    """The hashes logged for each epoch with a download log on disk."""
    return {k: download_log.read(k) for k in download_log.epochs()}


def roll_forward(layout: Layout, logged: Logged) -> None:
    """Publish each ``.part`` already logged; delete every other file in ``.tmp/``."""
    for entry in os.scandir(layout.cache_tmp):
        name = unpart(entry.name)
        parsed = parse_object_name(name)
        if parsed and is_part(entry.name) and parsed[2] in logged.get(parsed[0], ()):
            os.rename(entry.path, layout.cache_ready / name)  # roll forward
            log.info("rolled forward %s after a restart", name)
        else:
            os.unlink(entry.path)


def sweep_metas(layout: Layout, logged: Logged, on_disk: Container[str]) -> set[str]:
    """Delete each meta whose object is neither on disk nor logged; returns the names of the
    logged objects whose file is gone, to be fetched again."""
    refetch: set[str] = set()
    for entry in os.scandir(layout.cache_meta):
        name = unmeta(entry.name)
        parsed = parse_object_name(name)
        if name in on_disk:
            continue
        if parsed is not None and parsed[2] in logged.get(parsed[0], ()):
            refetch.add(name)  # published, then deleted before a writer read it
            log.warning("%s vanished from %s; fetching it again", name, layout.cache)
        else:
            os.unlink(entry.path)  # written early for a fetch that never finished
    return refetch
