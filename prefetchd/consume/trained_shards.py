"""Which objects of the epoch a resumable stream's covered shards held: each shard's mix file
(``messages/shard_mix.py``, written beside it by its writer) folded into the stream's
``TrainedObjects`` (``exactly_once/trained_objects.py``), for the ``objects`` of the positions
it writes (a resume on another number of hosts reads them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prefetchd.consume.position_format import Position
from prefetchd.exactly_once.trained_objects import ListingId, TrainedObjects
from prefetchd.layout import Layout, parse_object_name, parse_shard_name
from prefetchd.messages.shard_mix import ShardMix


class TrainedShards:
    """Owns one stream's ``TrainedObjects`` (``trained``; None: the stream keeps none, as it is
    not resumable), moved on to a later epoch when a shard of it is folded, and each epoch's
    ``epochs/<k>.listing``, read once per epoch (not per shard)."""

    def __init__(self, layout: Layout, trained: TrainedObjects | None = None) -> None:
        self._layout = layout
        self.trained = trained
        self._listings: dict[int, ListingId | None] = {}

    @classmethod
    def resumed(cls, layout: Layout, saved: Position) -> TrainedShards:
        """Carried over from the saved position: its ``objects``, or none known yet if it had
        consumed nothing, or unknown (a position of a trainer that did not keep them)."""
        objects = saved.objects
        trained = (
            TrainedObjects.from_json(objects)
            if objects is not None
            else TrainedObjects(saved.epoch)
            if not saved.consumed and not saved.records
            else TrainedObjects(saved.epoch, unknown="resumed from a position without them")
        )
        return cls(layout, trained)

    def objects(self, epoch: int, records: Mapping[str, int]) -> dict[str, Any] | None:
        """The ``objects`` of a position of ``epoch``: what the covered shards held, and the
        first ``records[shard]`` records of each shard in progress."""
        if self.trained is None:
            return None
        reading = {p.epoch for p in map(parse_shard_name, records) if p is not None}
        if self.trained.epoch == epoch:
            view = self.trained.copy()
        elif self.trained.epoch < epoch and epoch in reading:
            view = TrainedObjects(epoch)  # no shard of ``epoch`` covered yet
        elif self.trained.epoch < epoch:
            # past the end of the last epoch it read (a DataLoader worker's ended pass): what it
            # trained of that one, which a resume on other hosts adds to its host's
            return self.trained.to_json()
        else:
            view = TrainedObjects(epoch, unknown="a shard of an earlier epoch is kept")
        for shard, trained in sorted(records.items()):
            self.fold(shard, trained, view)
        return view.to_json()

    def fold(
        self, shard: str, records: int | None = None, into: TrainedObjects | None = None
    ) -> None:
        """Add what shard ``shard`` holds (its first ``records``; all if None) to the objects
        trained (``into``, or the stream's, which moves on to a later epoch's shard)."""
        parsed = parse_shard_name(shard)
        trained = into if into is not None else self.trained
        if trained is None or parsed is None or parsed.epoch < trained.epoch:
            return
        if parsed.epoch > trained.epoch:
            if into is not None:
                return
            trained = self.trained = TrainedObjects(parsed.epoch)
        if trained.unknown is not None:
            return
        if trained.listing is None:
            trained.listing = self._listing(trained.epoch)
        try:
            mix = ShardMix.decode(self._layout.shard_mix(shard).read_bytes())
        except (OSError, ValueError) as exc:
            trained.unknown = f"shard {shard}'s mix is not readable ({exc})"
            return
        counts = None if records is None else mix.trained(records)
        for part in mix.objects:
            name = parse_object_name(part.name)
            taken = part.count if counts is None else counts.get(part.name, 0)
            if name is None or (taken == 0 and not (part.last and counts is None)):
                continue
            end = part.start + part.count if part.last and taken == part.count else None
            trained.add(name[1], part.start, taken, end)

    def _listing(self, epoch: int) -> ListingId | None:
        """The listing the daemon laid epoch ``epoch`` out over; None if it wrote none (an
        older release) or it is not readable, which a resume on other hosts warns of."""
        if epoch not in self._listings:
            for done in [k for k in self._listings if k < epoch - 1]:
                del self._listings[done]  # an endless job would keep one per epoch
            try:
                raw = json.loads(self._layout.epoch_listing(epoch).read_bytes())
                self._listings[epoch] = ListingId.from_json(raw)
            except (OSError, ValueError):
                self._listings[epoch] = None
        return self._listings[epoch]
