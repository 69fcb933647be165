"""Epochs in the order trainers read them: when a writer may start a later epoch's objects, and
the room a later epoch's shard leaves in the RAM budget for the oldest incomplete one."""

from __future__ import annotations

from prefetchd.budget import RamBudget
from prefetchd.exactly_once.markers import first_epoch_without
from prefetchd.layout import Layout
from prefetchd.write.arrivals import Arrivals


class EpochOrder:
    """What one writer knows of the epochs' progress: the lowest epoch not yet complete
    (``complete`` markers only ever appear, so it only grows), and whether every epoch before
    one is downloaded. Owns the rules that keep a later epoch from starving an earlier one."""

    def __init__(self, layout: Layout, arrivals: Arrivals, writers: int) -> None:
        self.layout = layout
        self.arrivals = arrivals
        self.writers = writers
        self.oldest_epoch = 0  # lowest epoch not yet complete, as far as this writer knows

    def oldest_incomplete(self) -> int:
        """The lowest epoch without its ``complete`` marker (markers only ever appear)."""
        self.oldest_epoch = first_epoch_without(self.layout.complete_marker, self.oldest_epoch)
        return self.oldest_epoch

    def may_switch(self, epoch: int, shard_epoch: int | None) -> bool:
        """Whether this writer, with nothing open and its last shard of ``shard_epoch``, may
        take an object of ``epoch``: one of an earlier epoch than its shard's at once; one of
        a later epoch than the oldest incomplete only once every epoch before it is downloaded
        (``epochs/<k>.downloaded``), so that no object of those can still arrive.

        Trainers read epochs in order. A writer that took a later epoch's objects early filled
        the RAM budget with shards no trainer could read yet, then waited inside the budget
        holding them; an object of the earlier epoch that arrived after (fetched again after a
        fault or a restart) found no writer to take it, the epoch never ended and nothing ever
        freed the budget (the soak's stall). Once every earlier epoch is downloaded, its
        objects are all in ``ready/`` or claimed, and writers take them first (``ready/`` is
        listed in name order, epoch first), within the room ``headroom`` keeps for them."""
        if shard_epoch is not None and epoch < shard_epoch:
            return True
        if epoch <= self.oldest_epoch:
            return True  # no earlier epoch can be incomplete: no need to look at the markers
        oldest = self.oldest_incomplete()
        if epoch <= oldest:
            return True
        downloaded = self.layout.downloaded_marker
        if not all(downloaded(k).exists() for k in range(oldest, epoch)):
            return False
        # The listing the object came from may predate the last of those markers: list
        # again, so that an object of an earlier epoch that arrived just before it is taken
        # first (names sort by epoch).
        self.arrivals.list(force=True)
        return self.arrivals.first_is_of(epoch)

    def exhausted(self, epoch: int | None) -> bool:
        """Whether ``epoch`` has nothing left to give this writer: downloaded, and none of its
        objects waits in ready/."""
        if epoch is None or not self.layout.downloaded_marker(epoch).exists():
            return False
        return not self.arrivals.any_of(epoch)

    def headroom(self, shard_epoch: int | None, budget: RamBudget) -> int:
        """Room a shard of a later epoch must leave free for the oldest incomplete one.

        Trainers read epochs in order. If shards of epoch k+1 could fill the RAM budget while a
        writer still holds records of epoch k, epoch k could never finish and no trainer would
        ever free the budget. So a later epoch leaves half the budget (at least
        ``writers x chunk``) to the oldest incomplete one: its trainers may hold several of its
        shards at once — a resumable stream keeps those its last checkpoint covers until the
        next ``position()``, three when it checkpoints every two shards — and its writers need
        room besides for the shard they wait for. With only ``writers x chunk`` left to it, such
        a trainer waited for ever (tests/unit/write/test_ram_headroom.py).
        """
        if shard_epoch is None or shard_epoch <= self.oldest_incomplete():
            return 0
        return max(self.writers * budget.chunk, budget.budget // 2)
