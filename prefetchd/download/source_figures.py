"""Each source's figures in a job of several sources (``sources:``): what the downloader's
report carries per source (``SourceStatus``: weight, share, rate, window), kept as the plan
schedules epochs and the publisher publishes objects."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence

from prefetchd.config import Config
from prefetchd.download.jobs import Job
from prefetchd.download.mixture import EpochMix, epoch_weights
from prefetchd.layout import parse_object_name
from prefetchd.messages.source_status import SourceStatus


class SourceFigures:
    """Owns each source's figures in a job of several sources (``SourceStatus`` in the
    downloader's report): objects and bytes downloaded by this process, and the epoch being
    downloaded's planned and done bytes of each."""

    def __init__(self, config: Config) -> None:
        self.config = config
        count = len(config.sources)
        self.objects = [0] * count
        self.bytes = [0] * count
        self.epoch_bytes = [0] * count
        self.epoch_done = [0] * count

    def start_epoch(self, mix: EpochMix | None, sizes: Sequence[array[int]]) -> None:
        """The figures of the epoch now downloaded: its planned bytes of each source (``mix``:
        its mixed order; None with one source), nothing done yet."""
        count = len(self.config.sources)
        self.epoch_bytes = [0] * count
        self.epoch_done = [0] * count
        if mix is None:
            return
        for source, row in zip(mix.sources, mix.rows, strict=True):
            self.epoch_bytes[source] += sizes[source][row]

    def published(self, job: Job) -> None:
        """``job``'s object was published (downloaded or handed over)."""
        self.objects[job.source] += 1
        self.bytes[job.source] += job.obj.size

    def statuses(
        self, epoch: int, window: Mapping[str, int], mixes: Mapping[int, EpochMix]
    ) -> list[SourceStatus]:
        """Each source's figures now, in ``epoch``, with its bytes in ``window`` (name ->
        bytes held; ``mixes``: the epochs' mixed orders the plan holds, to tell the source)."""
        if not self.config.mixed:
            return []
        held = [0] * len(self.config.sources)
        for name, size in window.items():
            parsed = parse_object_name(name)
            mix = mixes.get(parsed[0]) if parsed is not None else None
            if parsed is not None and mix is not None and parsed[1] < len(mix):
                held[mix.sources[parsed[1]]] += size
        config = self.config
        names = [s.name for s in config.sources]
        base = [s.weight for s in config.sources]
        weights = epoch_weights(base, names, config.epochs.weights_by_epoch, epoch)
        done = sum(self.epoch_done)
        return [
            SourceStatus(
                name=names[i],
                weight=round(float(weights[i]), 6),
                objects_downloaded=self.objects[i],
                bytes_downloaded=self.bytes[i],
                window_bytes=held[i],
                epoch_bytes=self.epoch_bytes[i],
                epoch_bytes_done=self.epoch_done[i],
                share=round(self.epoch_done[i] / done, 6) if done else None,
            )
            for i in range(len(names))
        ]
