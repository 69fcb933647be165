"""``prefetchd.torch.RecordDataset``: the daemon's records as a PyTorch ``IterableDataset``.

Each ``iter()`` of the dataset is a ``prefetchd.records()`` stream, so every process that
iterates it — the main process with ``num_workers=0``, each DataLoader worker, each DDP rank —
claims its own shards through ``ready_files()``'s claims, and each record reaches exactly one
of them once per epoch. No worker index or rank is needed to split the work: a claim is an
atomic rename, whoever renames a shard first reads it.

State (``state_dict()`` / ``load_state_dict()``, used by torchdata's ``StatefulDataLoader``,
which snapshots each worker's dataset after every batch and keeps, per worker, the snapshot of
the last batch it handed to the training loop): the position format of
``consume/stream_position.py``, counting the records this process's stream yielded — the
shards finished, and the records of the one being read. Shards stay on the RAM disk after
their records were yielded, under this process's claim, until ``saved(state)`` (called by the
trainer once the loader's state is durably saved) frees those it covers; a worker whose epoch
ends hands what it keeps to the trainer's main process (the *holder*, a claimant that lives
as long as the job), so the daemon never takes a shard back that a saved state may cover.
A resumed worker first takes back the shards its saved state names (``reclaim``), before any
worker claims a shard: StatefulDataLoader loads every worker's state before it asks any for a
batch.

This module imports PyTorch (absolute ``import torch``) and never TensorFlow.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator
from multiprocessing.context import get_spawning_popen
from typing import Any

import torch.utils.data

from prefetchd.config import Config, load_config
from prefetchd.consume.claimant import ClaimantLock
from prefetchd.consume.position_format import job_for, parse_position
from prefetchd.consume.records import Records, records
from prefetchd.consume.take_back import free_saved, take_back
from prefetchd.layout import Layout, parse_claim_name, parse_shard_name

_PR_SET_PDEATHSIG = 1  # prctl(2)
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
        self.job = job_for(self.config)  # what its states are checked against
        self.epoch = None if epoch is None else self._checked(epoch)
        self.timeout = timeout
        self.transform = transform
        # Shared memory: workers get the cell itself (forked or pickled at their start), so a
        # set_epoch() in the trainer reaches persistent workers too, which a plain attribute
        # set after they started never would.
        self._chosen = multiprocessing.RawValue("q", _ALL_EPOCHS)
        self._layout = Layout.of(self.config)
        self._pending: dict[str, Any] | None = None  # a loaded state, for the next iter()
        self._stream: Records | None = None  # this process's current pass
        self._handed: list[str] = []  # claims its ended pass handed to the holder
        self._keeping = False  # whether a state was asked for: then read shards are kept
        self._holder: ClaimantLock | None = None  # the main process's (never pickled)
        self.holder_tag: str | None = None
        self._make_holder()

    def set_epoch(self, epoch: int) -> None:
        """Make every following ``iter()`` deliver epoch ``epoch`` (numbered from 0)."""
        self._chosen.value = self._checked(epoch)
        self._make_holder()

    def state_dict(self) -> dict[str, Any]:
        """Where this process's pass stands: a small JSON-able position (the shards finished
        and still kept, the records yielded of the one being read). Under a
        ``StatefulDataLoader`` each worker's is taken after each batch it makes, and the
        loader's ``state_dict()`` holds, per worker, the one of the last batch it yielded."""
        self._keeping = True  # a stateful loader: keep what is read until a save covers it
        if self._stream is not None:
            self._stream.keep_until_freed()
        if self._stream is None:
            state = self._pending or parse_position({}, self.job).to_json()
            state = {**state, "epoch": max(state["epoch"], self.current_epoch() or 0)}
        else:
            state = self._stream.snapshot()
        before = state["epoch"]
        held = [s for s in self._holder_claims() if _epoch(s) < before] + self._handed
        state["consumed"] = sorted(set(state["consumed"]) | set(held))
        if self.holder_tag is not None:
            state["holder"] = self.holder_tag
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` (one ``state_dict()`` returned) at the next ``iter()``.
        Raises ``PositionError`` (a ``ValueError``) if it is malformed, of an unknown version,
        or of another job (dataset, seed, host): never a silent fresh start."""
        parse_position(state, self.job)  # checked here, in the process that loads it
        self._pending, self._keeping = dict(state), True

    def saved(self, state: Any) -> int:
        """Call after saving a state (the loader's ``state_dict()``, or this dataset's) durably:
        frees the shards it covers from the RAM disk. Until then they stay, so a crash before
        the save loses nothing; a trainer that never calls it fills ``output.ram_budget`` and
        waits (``timeout`` says why). Returns how many shards were freed."""
        return sum(free_saved(self._layout, p, self.holder_tag) for p in _positions(state))

    def resume(self, state: Any) -> None:
        """Several trainer processes on one host (DDP ranks), each resuming its own saved
        state: call this with the state before ``loader.load_state_dict(state)``, then wait for
        every rank (``torch.distributed.barrier()``) before the first batch. It takes back, in
        this process, the shards the state's workers held, so no rank's workers claim a shard
        another rank's state covers; ``state`` is updated to find them here."""
        self._make_holder()
        if self.holder_tag is None:
            raise RuntimeError("resume() needs the daemon's RAM disk: start the daemon first")
        for position in _positions(state):
            parse_position(position, self.job)
            take_back(self._layout, position, self.holder_tag)

    def _make_holder(self) -> None:
        """The main process's claimant, made before the DataLoader starts its workers (they
        inherit its tag): what a worker keeps when its pass ends is handed to it."""
        if self._holder is None and self._layout.ram_consumers.is_dir():
            self._holder = ClaimantLock(self._layout)
            self.holder_tag = self._holder.claimant

    def _holder_claims(self) -> list[str]:
        if self.holder_tag is None:
            return []
        try:
            names = os.listdir(self._layout.ram_claimed)
        except FileNotFoundError:
            return []
        parsed = [parse_claim_name(n) for n in names]
        return [c[1] for c in parsed if c is not None and c[0] == self.holder_tag]

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
        state.update(_stream=None, _holder=None)  # a pass and a lock belong to one process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["_chosen"], int):
            state["_chosen"] = multiprocessing.RawValue("q", state["_chosen"])
        self.__dict__.update(state)

    def __iter__(self) -> Iterator[Any]:
        # Made now, not at the first next(): a loaded state's shards are taken back here
        # (StatefulDataLoader makes every worker's iterator before it asks for a batch).
        if torch.utils.data.get_worker_info() is not None:
            _die_with_parent()
        # A plain DataLoader never asks for a state: its shards are freed once read. Under a
        # StatefulDataLoader (state_dict() is asked for before the first batch) they are kept.
        position, self._pending = self._pending, None
        stream = records(
            self.config, epoch=self.current_epoch(), timeout=self.timeout, position=position
        )
        if self._keeping:
            stream.keep_until_freed()
        self._stream, self._handed = stream, []
        return self._deliver(stream)

    def _deliver(self, stream: Records) -> Iterator[Any]:
        for record in stream:
            yield record if self.transform is None else self.transform(record)
        if self.holder_tag is not None:
            self._handed = [c[1] for c in map(parse_claim_name, stream.kept_claims()) if c]
            stream.hand_off(self.holder_tag)


def _die_with_parent() -> None:
    """In a DataLoader worker: be killed with the trainer. PyTorch's own check notices a dead
    parent only within seconds, and while such a worker lives its claims look taken to a
    resumed job, which could end its epoch before the daemon returns them (their records
    would be trained by no one)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() == 1:  # the parent died before that took effect
        os.kill(os.getpid(), signal.SIGKILL)


def _epoch(shard: str) -> int:
    parsed = parse_shard_name(shard)
    return parsed.epoch if parsed is not None else -1


def _positions(state: Any) -> Iterator[dict[str, Any]]:
    """Every prefetchd position inside a (nested) loader state."""
    if isinstance(state, dict):
        if isinstance(state.get("version"), int) and "consumed" in state and "epoch" in state:
            yield state
            return
        for value in state.values():
            yield from _positions(value)
    elif isinstance(state, (list, tuple)):
        for value in state:
            yield from _positions(value)
