"""Fixtures for tests that play the daemon's part themselves (no daemon runs)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from prefetchd.config import Config, config_from_dict
from prefetchd.fence import write_fence
from prefetchd.layout import Layout


@pytest.fixture
def config(tmp_path: Path, ram_parent: Path) -> Iterator[Config]:
    """A two-epoch job's config with its directories created and its job fence held, as the
    supervisor makes them; shards of at most 1 MiB in a RAM budget of 8 MiB."""
    ram = Path(os.path.realpath(ram_parent)) / f"prefetchd-test-{os.getpid()}-{tmp_path.name}"
    cfg = config_from_dict(
        {
            "source": {"url": "s3://bucket/data/"},
            "epochs": {"count": 2},
            "download": {"cache_dir": str(tmp_path / "cache")},
            "output": {"ram_dir": str(ram), "ram_budget": "8MiB", "shard_size": "1MiB"},
            "status": {"state_dir": str(tmp_path / "state")},
        }
    )
    layout = Layout.of(cfg)
    layout.create()
    # the job fence a running daemon holds: trainers claim only under it (fence.py)
    fence = write_fence(layout.job_fence, "f" * 16, "a test plays the daemon")
    yield cfg
    os.close(fence)
    shutil.rmtree(ram, ignore_errors=True)
