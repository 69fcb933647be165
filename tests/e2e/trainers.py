"""Helpers for end-to-end tests: trainer processes and the daemon's status."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
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


def start_consumer(config: Path, out: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "consume.py"), str(config), str(out), *extra],
        stdout=subprocess.DEVNULL,
        stderr=open(out.with_suffix(".log"), "wb"),
    )


def finish(proc: subprocess.Popen[bytes], out: Path, timeout: float = 300) -> dict[str, Any]:
    code = proc.wait(timeout)
    log = out.with_suffix(".log").read_text(errors="replace")[-3000:]
    assert code == 0, f"consumer failed ({code}):\n{log}"
    return json.loads(out.read_text())


def status_json(config: Path) -> tuple[int, dict[str, Any] | None]:
    proc = subprocess.run(
        [sys.executable, "-m", "prefetchd", "status", "--config", str(config), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 else None
