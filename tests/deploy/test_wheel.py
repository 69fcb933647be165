"""Installed like a package: the sdist and wheel carry what they must, and the wheel, installed
into a fresh venv, runs ``--version``, ``check`` and a one-epoch job against a moto server on
127.0.0.1 with nothing from this checkout or the test venv in reach."""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd import __version__
from tests.deploy.conftest import Installed, sdist_names

pytestmark = pytest.mark.e2e

JOB_TIMEOUT = 180  # s: a one-epoch job of a few small objects takes seconds

# A trainer as a user writes one, run by the venv's python: every record of every shard.
TRAINER = """
import sys
from prefetchd import ready_files
from prefetchd.tfrecord import read_records

records = 0
for path in ready_files(sys.argv[1], timeout=60):
    with open(path, "rb") as f:
        records += sum(1 for _ in read_records(f))
print(records)
"""


def test_sdist_carries_the_sources_and_not_the_dev_tools(installed: Installed) -> None:
    names = set(sdist_names(installed.sdist))
    for needed in (
        "setup.py",
        "pyproject.toml",
        "MANIFEST.in",
        "README.md",
        "CHANGELOG.md",
        "prefetchd/py.typed",
        "prefetchd/kernel/_native.c",
        "prefetchd/kernel/_native.pyi",
        "systemd/prefetchd@.service",
        "docker/Dockerfile",
        "configs/example.yaml",
        "docs/operations.md",
    ):
        assert needed in names, f"{needed} missing from {installed.sdist.name}"
    dev = sorted(n for n in names if n.split("/")[0] in ("bench", "testkit", "tests"))
    assert dev == []
    assert not [n for n in names if n.endswith((".so", ".pyc"))]


def test_wheel_is_typed_and_carries_the_compiled_kernel(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = whl.namelist()
        entry_points = whl.read(f"prefetchd-{__version__}.dist-info/entry_points.txt").decode()
    assert "prefetchd/py.typed" in names and "prefetchd/kernel/_native.pyi" in names
    assert not [n for n in names if n.split("/")[0] in ("bench", "testkit", "tests")]
    assert "prefetchd = prefetchd.commands.cli:main" in entry_points
    if shutil.which("gcc") or shutil.which("cc"):  # optional=True: no compiler, no C kernel
        assert [n for n in names if n.startswith("prefetchd/kernel/_native.") and n.endswith(".so")]


def test_installed_package_is_the_one_imported(installed: Installed) -> None:
    proc = installed.run("prefetchd", "--version")
    assert (proc.returncode, proc.stdout.strip()) == (0, f"prefetchd {__version__}")
    where = installed.run("python", "-c", "import prefetchd; print(prefetchd.__file__)")
    assert where.stdout.startswith(str(installed.venv)), where.stdout + where.stderr


@pytest.fixture
def job(
    tmp_path: Path, upload: Callable[..., Any], write_config: Callable[..., Path]
) -> tuple[Path, int]:
    data = upload("tfrecord", [4096, 64 * 1024, 300 * 1024, 1024**2])
    config = write_config(tmp_path, epochs__count=1, source__addressing_style="path")
    return config, int(data["records"])


def test_installed_check_passes(installed: Installed, job: tuple[Path, int]) -> None:
    proc = installed.run("prefetchd", "check", "--config", str(job[0]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert "4 of 4 listed objects" in proc.stdout
    if shutil.which("gcc") or shutil.which("cc"):
        assert "writers frame records in native" in proc.stdout


def test_installed_package_runs_a_one_epoch_job(
    installed: Installed,
    job: tuple[Path, int],
    tmp_path: Path,
    daemons: list[subprocess.Popen[bytes]],
) -> None:
    config, records = job
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            [str(installed.bin / "prefetchd"), "run", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=installed.env(),
            cwd=tmp_path,
            start_new_session=True,
        )
    daemons.append(daemon)
    trainer = installed.run("python", "-c", TRAINER, str(config), timeout=JOB_TIMEOUT)
    assert trainer.returncode == 0, trainer.stderr + log.read_text()
    assert int(trainer.stdout) == records
    assert daemon.wait(JOB_TIMEOUT) == 0, log.read_text()
    # The finished daemon's last record says which release ran (exit 3: no longer running).
    status = installed.run("prefetchd", "status", "--config", str(config), "--json")
    assert status.returncode == 3, status.stderr
    record = json.loads(status.stdout)
    assert (record["state"], record["prefetchd_version"]) == ("done", __version__)
