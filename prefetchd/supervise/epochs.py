"""Which epochs are complete, and which epochs' ledgers may go.

Epoch k is complete once it is downloaded and no raw object of it is left: writers delete a
raw object only after the shard holding its last record is published. Its marker tells
trainers the epoch ended (``exactly_once/markers.py``). A complete epoch's ledger is dropped
once none of its shards is left on the RAM disk: trainers read them all.
"""

from __future__ import annotations

import logging
import os
import time

from prefetchd.config import Config
from prefetchd.exactly_once.ledger import forget_epoch
from prefetchd.exactly_once.markers import first_epoch_without, mark_complete
from prefetchd.layout import Layout, claimed_object, epoch_prefix, parse_claim_name
from prefetchd.supervise.deliveries import Deliveries, Failing

# the supervisor's lines keep their logger name (it is in every line): operators filter on it
log = logging.getLogger("prefetchd.supervise.supervisor")

EPOCH_CHECK_INTERVAL = 1.0


class EpochBooks:
    """Owns the two epoch counters of a run: ``next_epoch``, the lowest epoch not yet complete
    (the status record's ``epoch``), and ``ledger_epoch``, the lowest whose ledger may still be
    needed; writes the complete markers and forgets read epochs."""

    def __init__(
        self, config: Config, layout: Layout, deliveries: Deliveries, daemon: Failing
    ) -> None:
        self.config = config
        self.layout = layout
        self.deliveries = deliveries
        self.daemon = daemon
        self.next_epoch = 0  # lowest epoch not yet complete
        self.ledger_epoch = 0  # lowest epoch whose ledger may still be needed
        self._last_epoch_check = 0.0

    def first_incomplete(self) -> int:
        return first_epoch_without(self.layout.complete_marker)

    def check(self) -> None:
        """Mark epoch k complete once it is downloaded and no raw object of it is left: writers
        delete a raw object only after the shard holding its last record is published.

        The full check (and the disks') runs every ``EPOCH_CHECK_INTERVAL``; in between, on every
        tick once ``_may_be_complete``: trainers learn an epoch's end from its marker, so a
        marker written up to a second late kept them (and a job of one epoch) waiting that long.
        """
        now = time.monotonic()
        if now - self._last_epoch_check >= EPOCH_CHECK_INTERVAL:
            self._last_epoch_check = now
            self.deliveries.check_disks()
        elif not self._may_be_complete(self.next_epoch):
            return
        if self.daemon.failed:
            return
        count = self.config.epochs.count
        while (count is None or self.next_epoch < count) and self._epoch_complete(self.next_epoch):
            epoch = self.next_epoch
            mark_complete(self.layout, epoch)
            self.layout.download_log(epoch).unlink(missing_ok=True)
            log.info("epoch %d: every shard published", epoch)
            self.next_epoch += 1
        self._forget_read_epochs()

    def _forget_read_epochs(self) -> None:
        """Drop the ledger of complete epochs none of whose shards is left on the RAM disk:
        trainers read them all. The listing comes before the deliveries are noted, so every
        deletion it missed is in the ledger first."""
        while self.ledger_epoch < self.next_epoch:
            prefix = epoch_prefix(self.ledger_epoch)
            lay = self.layout
            try:
                names = os.listdir(lay.ram_ready) + os.listdir(lay.ram_tmp)
                claims = [parse_claim_name(n) for n in os.listdir(lay.ram_claimed)]
            except FileNotFoundError:
                return  # the RAM disk was emptied: check_disks fails the daemon
            names += [claim.shard for claim in claims if claim is not None]
            if any(n.startswith(prefix) for n in names):
                return
            self.deliveries.note()
            forget_epoch(lay, self.ledger_epoch)
            self.ledger_epoch += 1

    def _may_be_complete(self, epoch: int) -> bool:
        """The cheap half of ``_epoch_complete``: the epoch is downloaded and no writer holds an
        object of it (``claimed/`` holds at most ``writers x mix`` names, while ``ready/`` and
        ``meta/`` may hold a whole window's)."""
        if not self.layout.downloaded_marker(epoch).exists():
            return False
        prefix = epoch_prefix(epoch)
        try:
            claimed = os.listdir(self.layout.cache_claimed)
        except FileNotFoundError:
            return False  # the cache was emptied: check_disks fails the daemon with the reason
        return not any((claimed_object(n) or "").startswith(prefix) for n in claimed)

    def _epoch_complete(self, epoch: int) -> bool:
        if not self._may_be_complete(epoch):
            return False
        prefix = epoch_prefix(epoch)
        try:
            ready, meta = os.listdir(self.layout.cache_ready), os.listdir(self.layout.cache_meta)
        except FileNotFoundError:
            return False
        # An object's meta goes only once its records are in shards (or it was skipped): one
        # deleted from ready/ under us is still owed, and the downloader fetches it again.
        return not any(n.startswith(prefix) for n in (*ready, *meta))
