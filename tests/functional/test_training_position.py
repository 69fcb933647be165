"""``TrainingPosition`` on its own: a position counted in records the model finished, so a
pipeline that reads ahead loses nothing after a crash and repeats nothing it trained on.

No daemon runs here: the test writes shards and markers the way the writers and supervisor
do, and plays the supervisor returning a dead trainer's claims to ``ready/``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from prefetchd.atomic import write_atomic
from prefetchd.config import Config
from prefetchd.consume.position import TrainingPosition, count_records
from prefetchd.errors import PositionError
from prefetchd.layout import Layout, shard_name
from prefetchd.tfrecord import frame, read_records


@pytest.fixture
def config(config: Config) -> Config:
    """conftest's job, with a supervisor that reports itself running for the next hour."""
    record = {"state": "running", "pid": os.getpid(), "updated": time.time() + 3600}
    write_atomic(Layout.of(config).status_file, json.dumps(record).encode())
    return config


def publish(cfg: Config, epoch: int, counter: int, records: int) -> str:
    """A shard of ``records`` records named ``<epoch>/<counter>/<i>``."""
    name = shard_name(epoch, 0, counter)
    data = b"".join(frame(f"{epoch}/{counter}/{i}".encode()) for i in range(records))
    write_atomic(Layout.of(cfg).ram_ready / name, data)
    return name


def records_of(path: str, skip: int) -> list[str]:
    with open(path, "rb") as f:
        return [r.decode() for r in read_records(f)][skip:]


def crash(cfg: Config) -> None:
    """The trainer died: the daemon returns every claim to ready/ and the epoch is complete."""
    layout = Layout.of(cfg)
    for name in os.listdir(layout.ram_claimed):
        os.rename(layout.ram_claimed / name, layout.ram_ready / name.partition("-")[2])
    layout.complete_marker(0).write_bytes(b"{}")


def test_count_records_counts_frames(config: Config) -> None:
    publish(config, 0, 0, 5)
    assert count_records(str(Layout.of(config).ram_ready / shard_name(0, 0, 0))) == 5


def test_a_resumed_position_repeats_nothing_trained_and_loses_nothing_read_ahead(
    config: Config, tmp_path: Path
) -> None:
    everything = []
    for counter in range(4):
        publish(config, 0, counter, 5)
        everything += [f"0/{counter}/{i}" for i in range(5)]
    position = TrainingPosition({})
    files = position.files(config, 0, timeout=5)
    read_ahead = [records_of(*next(files)) for _ in range(3)]  # the pipeline ran ahead
    trained = [r for shard in read_ahead for r in shard][:7]  # the model finished 7 records
    position.trained(7)
    saved_path = tmp_path / "position.json"
    position.save(saved_path)
    saved = json.loads(saved_path.read_text())
    assert len(saved["consumed"]) == 1, "only the one fully trained shard is covered"
    assert list(saved["records"].values()) == [2], "two records of the second shard trained"

    crash(config)
    resumed = TrainingPosition.load(saved_path)
    rest = [r for path, skip in resumed.files(config, 0, timeout=5) for r in records_of(path, skip)]
    assert sorted(trained + rest) == sorted(everything), "records lost or trained twice"


def test_an_epoch_ended_early_is_refused(config: Config) -> None:
    publish(config, 0, 0, 3)
    position = TrainingPosition({})
    files = position.files(config, 0, timeout=5)
    next(files)
    position.trained(3)
    with pytest.raises(RuntimeError, match="epoch 0 was ended before its last record"):
        position.epoch_done(0)


def test_a_finished_epoch_moves_the_position_on(config: Config) -> None:
    publish(config, 0, 0, 2)
    Layout.of(config).complete_marker(0).write_bytes(b"{}")
    position = TrainingPosition({})
    assert [skip for _, skip in position.files(config, 0, timeout=5)] == [0]
    position.trained(2)
    position.epoch_done(0)
    assert position.to_json() == {"version": 2, "epoch": 1, "consumed": [], "records": {}}


def test_an_epoch_the_position_is_past_gives_nothing_and_leaves_the_position_where_it_is(
    config: Config,
) -> None:
    """Under a multi-worker strategy a worker whose share of epoch 0 ran out before the save
    still steps through epoch 0's end with the others after a restore."""
    saved = {"version": 2, "epoch": 1, "consumed": [], "records": {}}
    position = TrainingPosition(saved)
    assert list(position.files(config, 0, timeout=5)) == []
    position.epoch_done(0)
    assert position.to_json() == saved


def claimed(cfg: Config) -> list[str]:
    return [name.partition("-")[2] for name in os.listdir(Layout.of(cfg).ram_claimed)]


def test_a_save_that_keeps_past_epochs_frees_their_shards_only_when_told(
    config: Config, tmp_path: Path
) -> None:
    """``save(..., free_past_epochs=False)``: another worker may resume from the position
    before, inside the epoch, so its shards stay until every worker saved."""
    name = publish(config, 0, 0, 2)
    Layout.of(config).complete_marker(0).write_bytes(b"{}")
    position = TrainingPosition({})
    assert [skip for _, skip in position.files(config, 0, timeout=5)] == [0]
    position.trained(2)
    position.save(tmp_path / "inside.json")
    position.epoch_done(0)
    position.save(tmp_path / "past.json", free_past_epochs=False)
    assert claimed(config) == [name], "freed before every worker saved past the epoch"
    position.free_past_epochs()
    assert claimed(config) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"version": 1, "epoch": 0, "consumed": [], "records": {"x": 1}},
        {"version": 1, "epoch": 0, "consumed": [], "records": {shard_name(0, 0, 1): -1}},
        {"version": 1, "epoch": 0, "consumed": [], "records": []},
    ],
)
def test_a_malformed_training_position_is_a_value_error(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="position"):
        TrainingPosition(bad)


def test_a_saved_position_that_is_not_json_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "position.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=str(path)):
        TrainingPosition.load(path)


def test_a_position_saved_before_the_checkpoint_dir_exists_creates_it(tmp_path: Path) -> None:
    path = tmp_path / "ckpt" / "run-1" / "prefetchd-position.json"
    TrainingPosition().save(path)
    assert TrainingPosition.load(path).to_json() == TrainingPosition().to_json()


def test_training_stopped_mid_epoch_gives_untrained_shards_back(config: Config) -> None:
    layout = Layout.of(config)
    names = [publish(config, 0, counter, 2) for counter in range(3)]
    position = TrainingPosition({})
    files = position.files(config, 0, timeout=5)
    next(files), next(files)  # read ahead by the pipeline
    position.trained(3)  # the first shard and half of the second
    assert position.reading
    position.finish()
    assert sorted(os.listdir(layout.ram_ready)) == names[1:], "untrained shards not given back"
    assert not os.listdir(layout.ram_claimed), "a trained shard was kept"


def test_dataset_takes_a_training_position_and_an_epoch(config: Config) -> None:
    import prefetchd.tf

    with pytest.raises(TypeError, match="TrainingPosition"):
        prefetchd.tf.dataset(config, epoch=0, position={})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="needs epoch"):
        prefetchd.tf.dataset(config, position=TrainingPosition())


@pytest.mark.parametrize("api", ["tf.dataset", "keras.PositionCheckpoint"])
def test_a_training_position_of_another_job_raises_one_line_before_training(
    config: Config, tmp_path: Path, api: str
) -> None:
    """Not from inside tf.data's thread at the first batch: where the trainer hands it over."""
    position = TrainingPosition({})
    saved = {**position.to_json(), "job": {"dataset": "0123456789abcdef", "seed": 0}}
    path = tmp_path / "position.json"
    path.write_text(json.dumps(saved))
    with pytest.raises(PositionError, match=r"another dataset \(0123456789abcdef") as raised:
        if api == "tf.dataset":
            import prefetchd.tf

            prefetchd.tf.dataset(config, epoch=0, position=TrainingPosition.load(path))
        else:
            import prefetchd.keras

            prefetchd.keras.PositionCheckpoint(config, path, batch_size=8)
    assert "\n" not in str(raised.value)
