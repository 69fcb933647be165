"""The command line as users meet it: one line and the documented exit code for every mistake."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.e2e


def prefetchd(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prefetchd", *args], capture_output=True, text=True, timeout=timeout
    )


def assert_one_line(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    ("yaml_text", "needles"),
    [
        ("source: {url: s3://bkt/p/}\ndownload: {window: 16XB}\n", ("download.window", "16XB")),
        ("source: {url: s3://bkt/p/}\ndownload: {windw: 1GiB}\n", ("download.windw",)),
        ("source: {url: s3://bkt/p/}\nsource: {url: s3://cbk/}\n", ("duplicate key", "source")),
        ("source: {url: http://bkt/p/}\n", ("source.url", "http://bkt/p/")),
        ("output: {writers: 0}\nsource: {url: s3://bkt/}\n", ("output.writers", "0")),
        ("download: {cache_dir: /tmp/x}\n", ("source.url", "required")),
        ("source: {url: s3://bkt/}\nepochs: {count: -1}\n", ("epochs.count", "-1")),
        ("source: [1, 2\n", ("not valid YAML",)),
    ],
)
@pytest.mark.parametrize("command", ["run", "check", "status"])
def test_bad_config_is_one_line_and_exit_2(
    tmp_path: Path, command: str, yaml_text: str, needles: tuple[str, ...]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text)
    assert_one_line(prefetchd(command, "--config", str(path)), 2, *needles)


def test_missing_config_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    assert_one_line(prefetchd("run", "--config", str(missing)), 2, str(missing), "not found")


@pytest.mark.parametrize(
    "args",
    [(), ("frobnicate",), ("run",), ("status", "--config"), ("run", "--config", "x", "--bogus")],
)
def test_bad_usage_is_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    assert_one_line(prefetchd(*args), 2, "prefetchd")


def test_status_without_daemon_exits_3(tmp_path: Path, write_config: Callable[..., Path]) -> None:
    config = write_config(tmp_path)
    for extra in ((), ("--json",)):
        proc = prefetchd("status", "--config", str(config), *extra)
        assert_one_line(proc, 3, "not running")


def test_check_reports_a_healthy_setup(
    tmp_path: Path, upload: Callable[..., Any], write_config: Callable[..., Path]
) -> None:
    upload("tfrecord", [4096, 8192])
    proc = prefetchd("check", "--config", str(write_config(tmp_path)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert "2 of 2 listed objects" in proc.stdout
    assert "tmpfs" in proc.stdout
    # pip install builds the writers' C kernel here (gcc is on every test machine): a build
    # step that silently fell back to the slow Python twin would show here
    assert "writers frame records in native" in proc.stdout


def test_check_names_a_missing_bucket(tmp_path: Path, write_config: Callable[..., Path]) -> None:
    config = write_config(tmp_path, source__url="s3://no-such-bucket-here/data/")
    proc = prefetchd("check", "--config", str(config))
    assert proc.returncode == 1
    assert "FAIL" in proc.stdout and "no-such-bucket-here" in proc.stdout


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("s3://no-such-bucket-here/data/", "bucket 'no-such-bucket-here' does not exist"),
        (None, "no objects under"),
    ],
)
def test_run_stops_with_the_reason_when_it_cannot_start(
    tmp_path: Path,
    bucket: str,
    write_config: Callable[..., Path],
    url: str | None,
    needle: str,
) -> None:
    overrides = {"source__url": url} if url else {}
    config = write_config(tmp_path, **overrides)
    proc = prefetchd("run", "--config", str(config), timeout=120)
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert needle in last and last.startswith("prefetchd: ")
    assert "Traceback" not in proc.stderr
