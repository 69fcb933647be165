"""``prefetchd.torch.RecordDataset`` in a DataLoader, without a daemon: worker processes started
by fork and by spawn, ``set_epoch`` reaching persistent workers, and epoch mistakes reported
in the trainer. The test plays the daemon (see test_records.py); tests/e2e/test_torch.py runs
the real one.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import time
from collections import Counter

import pytest

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.layout import Layout, shard_name
from prefetchd.tfrecord import frame

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from prefetchd.torch import RecordDataset  # noqa: E402


@pytest.fixture
def config(config: Config) -> Config:
    """conftest's two-epoch job, a supervisor running for the next hour, and both epochs'
    shards published: 6 shards of 5 records each per epoch."""
    layout = Layout.of(config)
    record = {"state": "running", "pid": os.getpid(), "updated": time.time() + 3600}
    write_atomic(layout.status_file, json.dumps(record).encode())
    for epoch in (0, 1):
        for counter in range(6):
            data = b"".join(frame(f"{epoch}/{counter}/{i}".encode()) for i in range(5))
            write_atomic(layout.ram_ready / shard_name(epoch, 0, counter), data)
        write_atomic(layout.complete_marker(epoch), b"{}")
    return config


def expected(epoch: int) -> Counter[bytes]:
    return Counter(f"{epoch}/{c}/{i}".encode() for c in range(6) for i in range(5))


def tagged(record: bytes) -> tuple[bytes, int]:
    return record, os.getpid()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_follow_set_epoch(config: Config, context: str) -> None:
    dataset = RecordDataset(config, timeout=30, transform=tagged)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context=context,
    )
    workers: set[int] = set()
    for epoch in (0, 1):
        dataset.set_epoch(epoch)
        got = list(loader)
        assert Counter(r for r, _ in got) == expected(epoch), f"epoch {epoch}"
        workers |= {pid for _, pid in got}
    assert os.getpid() not in workers
    assert len(workers) <= 2, "new workers each epoch: set_epoch did not reach persistent ones"


def test_without_set_epoch_one_pass_is_the_whole_job(config: Config) -> None:
    got = list(DataLoader(RecordDataset(config, timeout=30), batch_size=None, num_workers=2))
    assert Counter(got) == expected(0) + expected(1)


def test_epoch_argument_gives_that_epoch(config: Config) -> None:
    got = list(DataLoader(RecordDataset(config, epoch=1, timeout=30), batch_size=None))
    assert Counter(got) == expected(1)
    assert (Layout.of(config).ram_ready / shard_name(0, 0, 0)).exists(), "epoch 0 untouched"


@pytest.mark.parametrize("epoch", [-1, 2])
def test_an_epoch_outside_the_job_is_refused_in_the_trainer(config: Config, epoch: int) -> None:
    with pytest.raises(ValueError, match=rf"epoch {epoch} is not one of this job's epochs"):
        RecordDataset(config, epoch=epoch)
    with pytest.raises(ValueError, match=r"epochs.count=2"):
        RecordDataset(config).set_epoch(epoch)


def test_copies_and_pickles_take_the_epoch_as_it_is(config: Config) -> None:
    """Only a worker being started shares the set_epoch cell; other copies get a snapshot."""
    dataset = RecordDataset(config, timeout=30)
    dataset.set_epoch(1)
    for twin in (copy.deepcopy(dataset), pickle.loads(pickle.dumps(dataset))):
        assert twin.current_epoch() == 1
        twin.set_epoch(0)
        assert dataset.current_epoch() == 1, "a copy changed the original's epoch"
        assert twin.current_epoch() == 0
    assert Counter(copy.deepcopy(dataset)) == expected(1)


def test_state_dict_resumes_inside_a_shard_under_a_stateful_dataloader(config: Config) -> None:
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader

    dataset = RecordDataset(config, timeout=30)
    dataset.set_epoch(0)
    loader = StatefulDataLoader(dataset, batch_size=None, num_workers=0)
    it = iter(loader)
    trained = [next(it) for _ in range(7)]  # the whole first shard and 2 of the second's
    first = json.loads(json.dumps(loader.state_dict()))  # what torch.save would keep
    assert _dataset_states(first)[0]["records"] == {shard_name(0, 0, 1): 2}
    trained += [next(it) for _ in range(4)]  # the rest of the second shard, 1 of the third's
    state = json.loads(json.dumps(loader.state_dict()))
    (position,) = _dataset_states(state)
    assert position["consumed"] == [shard_name(0, 0, 1)]
    assert position["records"] == {shard_name(0, 0, 2): 1}
    assert len(json.dumps(position)) < 1000, "the state should stay small"
    # the second shard was kept on the RAM disk until a saved state covered it
    assert dataset.saved(state) == 1
    del it  # the trainer dies here: a new one resumes from the saved state
    resumed = RecordDataset(config, timeout=30)
    resumed.set_epoch(0)
    again = StatefulDataLoader(resumed, batch_size=None, num_workers=0)
    again.load_state_dict(state)
    rest = list(again)
    assert Counter(trained) + Counter(rest) == expected(0), "lost or trained twice"


def test_a_state_of_another_seed_is_refused_with_one_line(config: Config) -> None:
    from dataclasses import replace

    from prefetchd.errors import PositionError

    state = RecordDataset(config).state_dict()
    other = RecordDataset(replace(config, epochs=replace(config.epochs, seed=5)))
    with pytest.raises(PositionError, match=r"epochs.seed=0 and this config has 5"):
        other.load_state_dict(state)
    with pytest.raises(PositionError, match=r"version 0 is not one this prefetchd reads"):
        other.load_state_dict({**state, "version": 0})


def _dataset_states(state: object) -> list[dict[str, object]]:
    if isinstance(state, dict):
        if "consumed" in state and "version" in state:
            return [state]
        return [s for v in state.values() for s in _dataset_states(v)]
    return []
