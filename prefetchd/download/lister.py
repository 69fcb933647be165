"""The downloader's start: wait this host's turn, then list its share of every source once.

A fleet's hosts start in turn (``stagger.py``). Each source's share is listed one after
another (``store.list_share``), its progress reported (status shows it: a bucket of millions
of keys lists for minutes, and a starving trainer should read why). A job resuming one run on
another number of hosts lists every key of every source (each key's old host is needed) and
keeps this host's part of what the old hosts left of the interrupted epoch (``rehost.py``).
Objects over the record limit are named before anything is fetched (``oversize.py``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from prefetchd.child.context import ChildContext
from prefetchd.config import ShardingConfig
from prefetchd.download.rehost import Remainder, split_mixed, split_remainder
from prefetchd.download.share import ShareTable
from prefetchd.download.signals import Signals
from prefetchd.download.stagger import start_delay
from prefetchd.download.store import S3Client, boot_failure, list_share, make_client
from prefetchd.errors import RuntimeFailure
from prefetchd.exactly_once.host_positions import HostPositions, read_host_positions
from prefetchd.exactly_once.markers import first_epoch_without
from prefetchd.messages.counters import DownloaderCounters
from prefetchd.oversize import Oversized

# the downloader's lines keep their logger name (it is in every line): operators filter on it
log = logging.getLogger("prefetchd.download.downloader")


class ShareLister:
    """Owns the downloader's listing at start-up: the stagger, each source's share, the
    listing progress in the report (``objects_listed``), and, resuming on another number of
    hosts, what is left of the interrupted epoch (``remainder``)."""

    def __init__(self, ctx: ChildContext, counters: DownloaderCounters, signals: Signals) -> None:
        self.ctx = ctx
        self.counters = counters
        self.config = ctx.config
        self.layout = ctx.layout
        self.signals = signals
        self.remainder: Remainder | None = None  # set by a resume on other hosts

    def stagger(self) -> None:
        """Wait this host's turn in a fleet's start (``stagger.py``), reporting meanwhile."""
        delay = start_delay(self.config)
        if delay <= 0:
            return
        log.info("waiting %.1fs before listing: hosts of the job start in turn", delay)
        deadline = time.monotonic() + delay
        while not self.ctx.should_stop() and time.monotonic() < deadline:
            self.ctx.report()
            time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def list_shares(self) -> list[ShareTable]:
        """This host's share of every source, listed one source after another; resuming on
        another number of hosts, every source whole, then split (``rehost.py``)."""
        client = make_client(self.config, pool=8, signals=self.signals)
        hosts = self._resumed_hosts()
        count = len(self.config.sources)
        whole = hosts is not None
        oversized = [Oversized(self.config, index) for index in range(count)]
        listed = [
            self._list_share(client, index, oversized[index], whole) for index in range(count)
        ]
        if hosts is not None:
            listed = self._split(listed, hosts)
            for share, over in zip(listed, oversized, strict=True):
                for obj in share:  # this host's objects only, as without resume_from
                    over.add(obj.key, obj.size)
        return [self._checked(listed[index], index, oversized[index]) for index in range(count)]

    def _split(self, listed: list[ShareTable], hosts: HostPositions) -> list[ShareTable]:
        """This host's shares and its part of the interrupted epoch, from every source whole."""
        if self.config.mixed:
            listed, remainder = split_mixed(listed, self.config, hosts)
            left = len(remainder.mix or ())
        else:
            share, remainder = split_remainder(listed[0], self.config, hosts)
            listed, left = [share], len(remainder.rows)
        self.remainder = remainder
        log.info(
            "resuming epoch %d of a job of %d hosts: %d objects of this host's share left "
            "(%d finished by the old hosts, %d records of objects begun left out)",
            remainder.epoch,
            hosts.num_workers,
            left,
            remainder.objects_trained,
            remainder.records_skipped,
        )
        return listed

    def listed(self, count: int) -> None:
        """Listing progress: status shows it (a bucket of millions of keys lists for minutes,
        and a starving trainer should read why), and the report is this child's heartbeat."""
        self.counters["objects_listed"] = count
        self.ctx.report()

    def _list_share(
        self, client: S3Client, index: int, oversized: Oversized, whole: bool
    ) -> ShareTable:
        """Source ``index``'s share (``whole``: every key, each key's old host being needed),
        its objects over the record limit added to ``oversized`` (unless ``whole``)."""
        listing = self.config
        if whole:
            listing = replace(self.config, sharding=ShardingConfig())
        share = ShareTable()
        source = self.config.sources[index]
        try:
            for obj in list_share(client, listing, listed=self.listed, source=source):
                share.append(obj)
                if not whole:
                    oversized.add(obj.key, obj.size)
            share.finish()
        except RuntimeFailure:
            raise
        except Exception as exc:
            raise boot_failure(self.config, exc, source) from None
        return share

    def _checked(self, share: ShareTable, index: int, oversized: Oversized) -> ShareTable:
        """``share`` of source ``index`` told in the log, refused if empty, its objects over
        the record limit named."""
        source, sharding = self.config.sources[index], self.config.sharding
        where = f"{source.url}" if not self.config.mixed else f"{source.url} (source {source.name})"
        if not share:
            raise RuntimeFailure(
                f"no objects under {where} match source.include {list(source.include)} "
                f"for worker {sharding.worker_index} of {sharding.num_workers}"
            )
        log.info(
            "%d objects, %.1f MiB in this host's share of %s (listing held in %.1f MiB)",
            len(share),
            share.total_size() / 2**20,
            where,
            share.nbytes() / 2**20,
        )
        if share.duplicates:
            log.warning("%d keys were listed more than once; each is read once", share.duplicates)
        too_large = oversized.message()
        if too_large and self.config.output.on_bad_object == "fail":
            raise RuntimeFailure(f"output.on_bad_object is fail: {too_large}")
        if too_large:
            log.warning("%s", too_large)
        return share

    def _resumed_hosts(self) -> HostPositions | None:
        """The old job's positions, if this job resumes one run on another number of hosts
        and its interrupted epoch is not downloaded yet."""
        if self.config.sharding.resume_from is None:
            return None
        hosts = read_host_positions(self.config)
        if first_epoch_without(self.layout.downloaded_marker) > hosts.epoch:
            return None
        return hosts
