"""Helpers for end-to-end tests: trainer processes and the daemon's status.

Trainer processes are ``testkit.trainers``' (the fault tests use them too)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testkit.trainers import finish_trainer, start_trainer

HERE = Path(__file__).resolve().parent
CONSUMER = "tests.e2e.consume"
finish = finish_trainer  # the consumer's output once it exits 0 (fails the test otherwise)
KIB, MIB = 1024, 1024**2
# 1 KiB to well past part_size (256 KiB), so both single and ranged GETs happen.
SIZES = [
    1 * KIB,
    3 * KIB,
    17 * KIB,
    64 * KIB,
    200 * KIB,
    300 * KIB,
    700 * KIB,
    1 * MIB,
    1536 * KIB,
    5 * KIB,
    90 * KIB,
    2 * MIB,
    12 * KIB,
    480 * KIB,
    33 * KIB,
    150 * KIB,
]


def start_consumer(
    config: Path, out: Path, *extra: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``consume.py`` (TensorFlow) as a trainer process (``testkit.trainers``)."""
    return start_trainer(CONSUMER, config, out, *extra, env=env)


def status_json(config: Path) -> tuple[int, dict[str, Any] | None]:
    proc = subprocess.run(
        [sys.executable, "-m", "prefetchd", "status", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 else None
