"""Nothing stuck, nothing leaked: permanent store errors, stale manifest sizes, secrets and
hostile keys, against the real daemon and moto (through the fault proxy).

Regressions: HTTP 416 was treated as transient and paused downloads for ever; a stale manifest
size let the crt client put a 23 MiB object into a 2 MiB window; a password in
``endpoint_url`` was printed by ``check``, the log, ``status.json`` and ``job.json``; a key with
a newline forged log lines.
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import load_config
from prefetchd.layout import Layout
from prefetchd.supervise.status import read_status as read_status_record
from prefetchd.supervise.status_table import render_table
from testkit.trainers import delivered, tree_bytes
from tests.faults.faultkit import error_keys, finish_reader, ids_of, read_status, start_reader
from tests.faults.faultproxy import FaultProxy, Rule

pytestmark = pytest.mark.e2e
CLIENTS = ["classic", "crt", "native"]
KIB, MIB = 1024, 1024**2
SIZES = [3 * KIB, 40 * KIB, 700 * KIB, 90 * KIB, 1 * MIB, 12 * KIB, 300 * KIB, 5 * KIB]
# One event per line: "<date> <time>,<ms> <LEVEL> prefetchd[<role>] <logger>: <message>"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ prefetchd\[[a-z0-9-]+\] ")

PROXY_SEED = 3  # the fault proxy's (the `proxy` fixture's)


def skip_lines(daemon: Any, key: str) -> list[str]:
    return [ln for ln in daemon.output(limit=10**6).splitlines() if "skipping" in ln and key in ln]


@pytest.mark.parametrize("client", CLIENTS)
def test_416_and_403_on_one_object_are_skipped_counted_and_the_epoch_ends(
    client: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """A 416 and a 403 (while the bucket lists fine) can never succeed: each object is skipped,
    counted and logged once; every other record arrives exactly once; the daemon exits 0."""
    dataset = upload("tfrecord", SIZES, seed=21)
    refused, forbidden = dataset["keys"][2], dataset["keys"][5]
    lost = ids_of(s3_client, bucket, refused, tmp_path) + ids_of(
        s3_client, bucket, forbidden, tmp_path
    )
    proxy.add(Rule("error", key=refused, status=416, code="InvalidRange", times=None))
    proxy.add(Rule("error", key=forbidden, status=403, code="AccessDenied", times=None))
    config = write_config(
        tmp_path, source__endpoint_url=proxy.url, epochs__count=1, download__client=client
    )
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 4, daemon.output()  # objects skipped: exit 4

    expected = Counter(dataset["ids"]) - Counter(lost)
    assert delivered([result]) == expected, "healthy records lost or doubled"
    status = read_status(config)
    assert status is not None
    assert status["objects_skipped"] == 2 and status["errors"] == 2
    assert {refused, forbidden} <= error_keys(status)
    (line,) = skip_lines(daemon, refused)
    assert "InvalidRange (HTTP 416)" in line and "retrying cannot help" in line
    (line,) = skip_lines(daemon, forbidden)
    assert "AccessDenied (HTTP 403)" in line
    assert proxy.gets(refused) <= 3, "a permanent error is not retried"


@pytest.mark.parametrize("client", CLIENTS)
def test_one_object_failing_for_ever_while_the_store_works_is_given_up(
    client: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """A 500 on every GET of one object while the bucket lists and the others download: after
    ``download.retries`` such failures it is skipped, counted, logged once; the epoch ends
    instead of pausing for ever."""
    dataset = upload("tfrecord", SIZES, seed=25)
    victim = dataset["keys"][4]
    lost = ids_of(s3_client, bucket, victim, tmp_path)
    proxy.add(Rule("error", key=victim, status=500, code="InternalError", times=None))
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        epochs__count=1,
        download__client=client,
        download__retries=1,
    )
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 4, daemon.output()  # objects skipped: exit 4

    assert delivered([result]) == Counter(dataset["ids"]) - Counter(lost)
    status = read_status(config)
    assert status is not None and status["objects_skipped"] == 1
    (line,) = skip_lines(daemon, victim)
    assert "failed 2 times while the store served other requests" in line, line


def raw_bytes(layout: Layout) -> int:
    """Bytes of raw objects in cache_dir: in flight (pre-sized), ready and claimed."""
    return tree_bytes(layout.cache, only=(".tmp", "ready", "claimed"))


class Sampler:
    """The largest ``cache_bytes`` seen, sampled on a thread while the daemon runs."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.peak = 0
        self.samples = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, raw_bytes(self.layout))  # 0 before cache_dir exists
            self.samples += 1

    def __enter__(self) -> Sampler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stale_manifest_size_never_pushes_downloads_past_the_window(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """The manifest says 16 KiB, the store holds 1.5 MiB: the real size is admitted against
    ``download.window`` before its bytes land, and every record arrives exactly once."""
    sizes = [300 * KIB] * 6 + [1536 * KIB]
    dataset = upload("tfrecord", sizes, seed=22)
    big = dataset["keys"][-1]
    manifest = tmp_path / "manifest.txt"
    manifest.write_text(
        "".join(
            f"{key}\t{16 * KIB if key == big else dataset['sizes'][key]}\n"
            for key in dataset["keys"]
        ),
        encoding="utf-8",
    )
    window = 2 * MIB
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        source__manifest=str(manifest),
        epochs__count=1,
        download__client=client,
        download__window=window,
    )
    layout = Layout.of(load_config(config))
    with Sampler(layout) as sampler:
        daemon = run_daemon(config)
        out = tmp_path / "trainer.json"
        result = finish_reader(start_reader(config, out), out)
        assert daemon.wait(120) == 0, daemon.output()
    assert sampler.samples > 10
    assert sampler.peak <= window, f"{sampler.peak} bytes in a {window}-byte window"
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    status = read_status(config)
    assert status is not None and status["objects_skipped"] == 0
    assert any("a stale source.manifest size" in ln for ln in daemon.output(10**6).splitlines())


SECRET = "s3cretpw"


def files_holding(root: Path, secret: bytes) -> list[Path]:
    if not root.exists():
        return []
    return [p for p in root.rglob("*") if p.is_file() and secret in p.read_bytes()]


def test_a_password_in_endpoint_url_is_refused_and_never_shown(
    tmp_path: Path,
    s3_endpoint: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """``http://user:s3cretpw@127.0.0.1:PORT``: S3 never takes credentials from a URL, so the
    daemon, ``check`` and ``status`` refuse it (exit 2, one line naming the key) — and the
    password appears in no output and no file the daemon wrote."""
    upload("tfrecord", SIZES[:2], seed=23)
    endpoint = s3_endpoint.replace("://", f"://user:{SECRET}@", 1)
    config = write_config(tmp_path, source__endpoint_url=endpoint, epochs__count=1)
    daemon = run_daemon(config)
    assert daemon.wait(60) == 2
    outputs = [daemon.output(10**6)]
    for command in ("check", "status"):
        done = subprocess.run(
            [sys.executable, "-m", "prefetchd", command, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        outputs += [done.stdout, done.stderr]
    for text in outputs:
        assert SECRET not in text
        assert "Traceback" not in text
    (line,) = daemon.stderr.read_text(encoding="utf-8").strip().splitlines()
    assert "source.endpoint_url" in line and "user:password@" in line
    for directory in ("cache", "state"):
        assert files_holding(tmp_path / directory, SECRET.encode()) == []
    assert files_holding(tmp_path, SECRET.encode()) == [config], "only the user's own config"


def rename_object(s3_client: Any, bucket: str, key: str, new: str) -> None:
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    s3_client.put_object(Bucket=bucket, Key=new, Body=body)
    s3_client.delete_object(Bucket=bucket, Key=key)


def test_keys_with_control_characters_cannot_forge_log_lines(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    """Keys holding a CR, an ANSI escape, a Unicode line separator and a whole forged log
    line: every event the daemon logs is one line, with the keys escaped; ``status`` shows them
    escaped too. (moto cannot store a key with "\\n": that one is in tests/unit/test_logs.py.)"""
    dataset = upload("tfrecord", SIZES, seed=24)
    forged = "2026-01-01 00:00:00,000 INFO prefetchd[supervisor] prefetchd: all good"
    hostile = [
        f"{dataset['prefix']}evil-cr\r{forged}",
        f"{dataset['prefix']}evil-ansi\x1b[31mred",
        f"{dataset['prefix']}evil-ls\u2028{forged}",
    ]
    for key, new in zip(dataset["keys"][:3], hostile, strict=True):
        rename_object(s3_client, bucket, key, new)
    for key in hostile:  # moto cannot list these keys' versions when the bucket goes
        request.addfinalizer(functools.partial(s3_client.delete_object, Bucket=bucket, Key=key))
    gone = [ids_of(s3_client, bucket, k, tmp_path) for k in hostile]
    for name in ("evil-cr", "evil-ansi", "evil-ls"):  # refused: the daemon logs each key
        proxy.add(Rule("error", key=name, status=416, code="InvalidRange", times=None))
    config = write_config(tmp_path, source__endpoint_url=proxy.url, epochs__count=1)
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 4, daemon.output()  # objects skipped: exit 4

    lost = Counter(i for ids in gone for i in ids)
    assert delivered([result]) == Counter(dataset["ids"]) - lost
    log = daemon.stderr.read_text(encoding="utf-8", errors="replace")
    assert "\x1b" not in log and "\r" not in log
    lines = log.splitlines()
    assert lines and all(LOG_LINE.match(ln) for ln in lines), [
        ln for ln in lines if not LOG_LINE.match(ln)
    ]
    assert not [ln for ln in lines if ln.startswith(forged[:23]) and "all good" in ln]
    for word in ("evil-cr\\r", "evil-ansi\\x1b[31mred", "evil-ls\\u2028"):
        assert len([ln for ln in lines if "skipping" in ln and word in ln]) == 1, word
    # what `prefetchd status` prints, from the daemon's last status record
    record = read_status_record(Layout.of(load_config(config)))
    assert record is not None
    shown = render_table(record)
    assert "\x1b" not in shown and "\r" not in shown and "\u2028" not in shown
    assert "evil-ansi\\x1b[31mred" in shown, shown
