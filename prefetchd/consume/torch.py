"""``prefetchd.torch.RecordDataset``: the daemon's records as a PyTorch ``IterableDataset``.

Each ``iter()`` of the dataset is a ``prefetchd.records()`` stream, so every process that
iterates it — the main process with ``num_workers=0``, each DataLoader worker, each DDP rank —
claims its own shards through ``ready_files()``'s claims, and each record reaches exactly one
of them once per epoch. No worker index or rank is needed to split the work: a claim is an
atomic rename, whoever renames a shard first reads it.

This module imports PyTorch (absolute ``import torch``) and never TensorFlow.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch.utils.data

from prefetchd.config import Config, load_config
from prefetchd.consume.records import records

_ALL_EPOCHS = -1  # the shared epoch cell's value while set_epoch() was never called


class RecordDataset(torch.utils.data.IterableDataset[Any]):
    """The serialized records (``bytes``) of this host's shards, or ``transform(record)``.

    Epochs: ``set_epoch(k)`` before each pass (as with ``DistributedSampler``) makes the next
    ``iter()`` — in this process and in every DataLoader worker, persistent ones included —
    deliver epoch ``k`` and stop at its end. Without ``set_epoch``, ``epoch=k`` gives epoch ``k``
    on every pass (once consumed, a pass is empty) and ``epoch=None`` one pass over all epochs
    of the job in order. ``timeout`` is ``records()``'s (seconds without a new shard).
    """

    def __init__(
        self,
        config: str | os.PathLike[str] | Config,
        *,
        epoch: int | None = None,
        timeout: float | None = None,
        transform: Callable[[bytes], Any] | None = None,
    ) -> None:
        super().__init__()
        # Loaded and checked here: a mistake shows in the trainer, not in a worker's traceback.
        self.config = config if isinstance(config, Config) else load_config(config)
        self.epoch = None if epoch is None else self._checked(epoch)
        self.timeout = timeout
        self.transform = transform
        # Shared memory: workers get the cell itself (forked or pickled at their start), so a
        # set_epoch() in the trainer reaches persistent workers too, which a plain attribute
        # set after they started never would.
        self._chosen = multiprocessing.RawValue("q", _ALL_EPOCHS)

    def set_epoch(self, epoch: int) -> None:
        """Make every following ``iter()`` deliver epoch ``epoch`` (numbered from 0)."""
        self._chosen.value = self._checked(epoch)

    def _checked(self, epoch: int) -> int:
        count = self.config.epochs.count
        if epoch < 0 or (count is not None and epoch >= count):
            raise ValueError(
                f"epoch {epoch} is not one of this job's epochs (epochs.count={count})"
            )
        return epoch

    def current_epoch(self) -> int | None:
        """The epoch the next ``iter()`` delivers; ``None``: every epoch of the job."""
        chosen = int(self._chosen.value)
        return self.epoch if chosen == _ALL_EPOCHS else chosen

    def __getstate__(self) -> dict[str, Any]:
        """Starting a worker passes the shared cell itself; any other copy or pickle (a
        ``copy.deepcopy``, a framework saving the dataset) gets the epoch as it is now, in a
        cell of its own, because shared memory cannot be pickled outside a process start."""
        state = dict(self.__dict__)
        if get_spawning_popen() is None:
            state["_chosen"] = int(self._chosen.value)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_chosen"], int):
            state["_chosen"] = multiprocessing.RawValue("q", state["_chosen"])
        self.__dict__.update(state)

    def __iter__(self) -> Iterator[Any]:
        stream = records(self.config, epoch=self.current_epoch(), timeout=self.timeout)
        if self.transform is None:
            return stream
        return map(self.transform, stream)
