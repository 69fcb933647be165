"""Every example config in configs/ loads (what the README points users to)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefetchd.config import load_config
from prefetchd.write.formats import get_format

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_example_config_loads(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = {"worker": ["a:1", "b:1", "c:1"]}
    monkeypatch.setenv(
        "TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}})
    )
    config = load_config(path)
    if ":" not in config.source.format:  # plugin examples name a module users write
        get_format(config.source.format)


def test_every_builtin_format_has_an_example() -> None:
    formats = {load_config(p).source.format for p in CONFIGS if "multihost" not in p.name}
    assert {"tfrecord", "lines", "tar"} <= formats
    assert any(":" in f for f in formats)
