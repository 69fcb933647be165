"""Fixtures the supervise tests share: a minimal config in private directories under
``tmp_path``, and its layout created."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefetchd.config import Config
from prefetchd.layout import Layout
from tests.unit.configs import unit_config


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return unit_config(tmp_path)


@pytest.fixture
def layout(config: Config) -> Layout:
    layout = Layout.of(config)
    layout.create()
    return layout
