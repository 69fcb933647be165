"""What the writer tests that drive a ``Writer`` step by step have in common: a ``lines`` config,
objects published into ``cache/ready`` as the downloader publishes them (meta first, then a
rename), a clock for the writer module that moves only when the test says so, and a child
context that stops the writer once it has consumed every prepared object."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from prefetchd.child.context import ChildContext
from prefetchd.config import Config
from prefetchd.layout import Layout, key_hash, object_name
from tests.unit.configs import BUCKET, unit_config


class StopWhenConsumed(ChildContext):
    """Stops the writer once it has consumed every prepared object."""

    def __init__(self, config: Config, objects: int) -> None:
        super().__init__("writer-0", config)
        self.objects = objects

    def should_stop(self) -> bool:
        consumed = self.counters.get("objects_consumed", 0)
        return isinstance(consumed, int) and consumed >= self.objects


class FakeClock:
    """``time.monotonic`` for the writer's modules (the ``clock`` fixture installs it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def lines_config(root: Path, *, epochs: dict[str, Any], output: dict[str, Any]) -> Config:
    """A ``lines`` config under ``root``, its directories created."""
    config = unit_config(root, source={"format": "lines"}, epochs=epochs, output=output)
    Layout.of(config).create()
    return config


def publish(config: Config, epoch: int, seq: int, body: bytes) -> str:
    """Object ``seq`` of ``epoch`` (key ``d/<seq>.jsonl``) into ready/: its meta, then its
    bytes renamed in, as the downloader does (a watching writer learns of it from inotify)."""
    layout = Layout.of(config)
    key = f"d/{seq:04d}.jsonl"
    name = object_name(epoch, seq, key_hash(BUCKET, key))
    (layout.cache_meta / f"{name}.json").write_text(json.dumps({"key": key}))
    (layout.cache_tmp / name).write_bytes(body)
    os.rename(layout.cache_tmp / name, layout.cache_ready / name)
    return name
