"""Fixtures the supervise tests share: a minimal config in private directories under
``tmp_path``, and its layout created."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefetchd.config import Config, load_config
from prefetchd.layout import Layout


@pytest.fixture
def config(tmp_path: Path) -> Config:
    path = tmp_path / "prefetchd.yaml"
    path.write_text(
        "source:\n  url: s3://bucket/prefix/\n"
        f"download:\n  cache_dir: {tmp_path / 'cache'}\n"
        f"output:\n  ram_dir: {tmp_path / 'ram'}\n"
        f"status:\n  state_dir: {tmp_path / 'state'}\n",
        encoding="utf-8",
    )
    return load_config(path)


@pytest.fixture
def layout(config: Config) -> Layout:
    layout = Layout.of(config)
    layout.create()
    return layout
