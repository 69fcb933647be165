"""`prefetchd status` stays quick: it loads neither the daemon, boto3 nor the trainer side."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import prefetchd

# Modules only `run`, `check` or a trainer need; importing any of them costs `status` time.
NOT_FOR_STATUS = (
    "boto3",
    "botocore",
    "prefetchd.consume.ready",
    "prefetchd.inotify",
    "prefetchd.supervise.supervisor",
    "prefetchd.commands.check",
    "tensorflow",
)


def imported_by_status(tmp_path: Path) -> tuple[int, set[str]]:
    config = tmp_path / "prefetchd.yaml"
    config.write_text(
        "source: {url: s3://bkt/p/}\n"
        f"download: {{cache_dir: {tmp_path / 'cache'}}}\n"
        f"output: {{ram_dir: {tmp_path / 'ram'}}}\n"
        f"status: {{state_dir: {tmp_path / 'state'}}}\n"
    )
    cmd = [sys.executable, "-X", "importtime", "-m", "prefetchd", "status", "--config", str(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    modules = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc.returncode, modules


def test_status_without_a_daemon_imports_only_what_it_needs(tmp_path: Path) -> None:
    code, modules = imported_by_status(tmp_path)
    assert code == 3  # not running
    assert "prefetchd.supervise.status" in modules  # the importtime listing was read
    assert not modules & set(NOT_FOR_STATUS), sorted(modules & set(NOT_FOR_STATUS))


def test_the_package_names_load_on_first_use() -> None:
    from prefetchd import DaemonFailed, ready_files
    from prefetchd.consume.ready import ready_files as defined
    from prefetchd.errors import DaemonFailed as error

    assert ready_files is defined and DaemonFailed is error
    assert {"ready_files", "load_config", "Config", "DaemonFailed"} <= set(dir(prefetchd))


def test_an_unknown_package_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        prefetchd.no_such_name  # noqa: B018
