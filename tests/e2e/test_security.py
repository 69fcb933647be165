"""A shared host: hostile object keys, planted symlinks, credentials in the environment.

The daemon runs from its CLI against moto on 127.0.0.1 (which stores such keys as given)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from testkit.s3server import free_port

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent

HOSTILE_KEYS = [
    "../../etc/passwd",
    "/abs/path",
    "a/../../b",
    "..",
    "./x",
    "x" * 1000,  # S3 allows 1024 bytes
    "dir/" * 200 + "file",
    "é/ü/日本語/🙂.bin",
    "\u202eevil\u202c.txt",  # right-to-left override
    "tab\tand space",  # (moto's server rejects a newline in a key; tests/unit covers it)
    "C:\\Windows\\system32",
    "~root/.ssh/authorized_keys",
    "%2e%2e%2fescaped",
    "plain",
]


def consume(config: Path, out: Path) -> dict[str, Any]:
    # Output captured, not logged to a file: the test checks its directory for stray files.
    proc = subprocess.run(
        [sys.executable, str(HERE / "consume.py"), str(config), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def every_path(*roots: Path) -> set[Path]:
    found: set[Path] = set()
    for root in roots:
        for directory, dirs, files in os.walk(root):
            found.update(Path(directory) / name for name in dirs + files)
    return found


def test_hostile_keys_are_downloaded_and_never_escape(
    tmp_path: Path,
    s3_client: S3Client,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    for i, key in enumerate(HOSTILE_KEYS):
        s3_client.put_object(Bucket=bucket, Key=key, Body=f"payload {i}".encode())
    listed = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(listed) == sorted(HOSTILE_KEYS), "moto changed a key"

    work = tmp_path / "work"
    config_path = write_config(
        work, source__url=f"s3://{bucket}/", source__format="raw", epochs__count=1
    )
    config = yaml.safe_load(config_path.read_text())
    ram_root = Path(config["output"]["ram_dir"]).parent
    outside_before = every_path(tmp_path, ram_root.parent / ram_root.name)
    etc_passwd = os.stat("/etc/passwd")

    daemon = run_daemon(config_path)
    result = consume(config_path, tmp_path / "c.json")
    assert daemon.wait(120) == 0, daemon.output()

    delivered = Counter(key for _, key in result["records"])
    assert delivered == Counter(HOSTILE_KEYS), "a hostile key was lost, doubled or mangled"
    after = os.stat("/etc/passwd")
    assert (after.st_mtime_ns, after.st_size) == (etc_passwd.st_mtime_ns, etc_passwd.st_size)
    # Every new name is one of the daemon's own, inside its own directories.
    inside = (Path(config["download"]["cache_dir"]), Path(config["status"]["state_dir"]), ram_root)
    new = every_path(tmp_path, ram_root) - outside_before
    ours = {work, work / "prefetchd.yaml", tmp_path / "c.json", *tmp_path.glob("daemon-*")}
    strays = [p for p in new - ours if not any(p == d or d in p.parents for d in inside)]
    assert not strays, f"files outside the daemon's directories: {strays}"
    for path in new:
        assert path.name.isascii() and path.name.isprintable(), path
        assert not path.is_symlink(), path


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant a symlink as another user")
def test_a_symlink_planted_in_dev_shm_is_never_written_through(
    tmp_path: Path,
    ram_parent: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
) -> None:
    """Another user made /dev/shm/<name> (the parent of ram_dir) a symlink to their own
    directory before the daemon first ran: it refuses to start and writes nothing there."""
    upload("tfrecord", [4096])
    victim = tmp_path / "victim"
    victim.mkdir()
    link = ram_parent / f"prefetchd-test-{os.getpid()}-planted"
    link.symlink_to(victim)
    try:
        os.lchown(link, 65534, 65534)
        for ram_dir in (link, link / "ram"):
            config = write_config(tmp_path / ram_dir.name, output__ram_dir=ram_dir)
            proc = subprocess.run(
                [sys.executable, "-m", "prefetchd", "run", "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert proc.returncode == 1, proc.stderr
            last = proc.stderr.strip().splitlines()[-1]
            assert str(link) in last and "symlink" in last, last
            assert "Traceback" not in proc.stderr
            assert list(victim.iterdir()) == [], "the daemon wrote through the planted symlink"
            check = subprocess.run(
                [sys.executable, "-m", "prefetchd", "check", "--config", str(config)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert check.returncode == 1
            assert f"FAIL output.ram_dir: refusing to use {ram_dir}" in check.stdout, check.stdout
            assert list(victim.iterdir()) == [], "check wrote through the planted symlink"
    finally:
        link.unlink()


# --- credentials --------------------------------------------------------------------------------

SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIASECRETLEAKCHECKID",
    "AWS_SECRET_ACCESS_KEY": "leakcheck/Secret+Access+Key/0123456789abcdef",
    "AWS_SESSION_TOKEN": "FwoGZXIvYXdzLEAKCHECKSESSIONTOKEN//////////0123456789",
}


def test_credentials_never_appear_in_logs_status_metrics_or_errors(
    tmp_path: Path,
    s3_client: S3Client,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", [4096, 64 * 1024, 300 * 1024], seed=4)
    # one object that is not a TFRecord: quarantined, so an error with its key is reported
    s3_client.put_object(Bucket=bucket, Key="data/broken.tfrecord", Body=b"\x07" * 2048)
    port = free_port()
    config_path = write_config(
        tmp_path, epochs__count=1, log__level="debug", status__metrics_port=port
    )
    env = {**os.environ, **SECRETS}
    outputs: list[str] = []

    daemon = run_daemon(config_path, env=SECRETS)
    status_text = ""
    metrics_text = ""
    for _ in range(300):
        proc = subprocess.run(
            [sys.executable, "-m", "prefetchd", "status", "--config", str(config_path), "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        if proc.returncode == 0 and json.loads(proc.stdout).get("errors"):
            status_text = proc.stdout
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                metrics_text = r.read().decode()
            table = subprocess.run(
                [sys.executable, "-m", "prefetchd", "status", "--config", str(config_path)],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
            outputs += [table.stdout, table.stderr]
            break
        if not daemon.alive():
            break
    assert status_text, f"status never showed the quarantined object\n{daemon.output()}"
    assert "broken.tfrecord" in status_text
    consume_env = subprocess.run(
        [sys.executable, str(HERE / "consume.py"), str(config_path), str(tmp_path / "c.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert consume_env.returncode == 0, consume_env.stderr[-2000:]
    assert daemon.wait(120) == 4, daemon.output()  # broken.tfrecord quarantined
    log = daemon.output(limit=10**7)
    assert "DEBUG" in log, "log.level debug did not reach the daemon"

    # error messages of commands that fail: a missing bucket, and `check`
    for command, url in (("run", "s3://no-such-bucket-leakcheck/x/"), ("check", None)):
        overrides = {"source__url": url} if url else {}
        config = write_config(tmp_path / f"other-{command}", log__level="debug", **overrides)
        proc = subprocess.run(
            [sys.executable, "-m", "prefetchd", command, "--config", str(config)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        outputs += [proc.stdout, proc.stderr]

    state = Path(yaml.safe_load(config_path.read_text())["status"]["state_dir"])
    files = [p.read_text(errors="replace") for p in state.rglob("*") if p.is_file()]
    haystacks = {
        "daemon log": log,
        "status --json": status_text,
        "metrics": metrics_text,
        "trainer": consume_env.stdout + consume_env.stderr,
        "other commands": "\n".join(outputs),
        "state files": "\n".join(files),
    }
    for where, text in haystacks.items():
        for name, secret in SECRETS.items():
            assert secret not in text, f"{name} appears in the {where}"
            # nor a fragment long enough to matter (e.g. a token cut by a line wrap)
            assert secret[:16] not in text, f"part of {name} appears in the {where}"
