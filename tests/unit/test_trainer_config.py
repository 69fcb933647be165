"""The trainer side loads the daemon's config without resolving sharding: it needs no
TF_CONFIG (regression: ``ready_files()`` raised ConfigError under ``num_workers: auto``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefetchd.config import ShardingConfig, load_config
from prefetchd.errors import ConfigError

AUTO = """
source: {url: "s3://bucket/data/"}
sharding: {num_workers: auto}
"""


def test_the_trainer_loads_an_auto_sharded_config_without_tf_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    path = tmp_path / "prefetchd.yaml"
    path.write_text(AUTO)
    assert load_config(path, trainer=True).sharding == ShardingConfig()
    with pytest.raises(ConfigError, match="TF_CONFIG is not set"):
        load_config(path)  # the daemon still needs it


def test_the_trainer_ignores_a_tf_config_meant_for_tf_distribute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {"ps": ["h:1"]}, "task": {"type": "ps"}}')
    path = tmp_path / "prefetchd.yaml"
    path.write_text(AUTO)
    assert load_config(path, trainer=True).sharding == ShardingConfig()


def test_the_trainer_still_rejects_worker_index_with_auto(tmp_path: Path) -> None:
    path = tmp_path / "prefetchd.yaml"
    path.write_text(AUTO.replace("auto}", "auto, worker_index: 1}"))
    with pytest.raises(ConfigError, match=r"sharding\.worker_index must not be set"):
        load_config(path, trainer=True)
