"""prefetchd for a normal user, installed from the wheel: a config that names only the bucket
and its endpoint works with the per-user default directories, and a user who may not use
another user's directories gets one line that says so, never a traceback.

Runs as a fresh user made with ``useradd`` (removed afterwards), so it needs root; skipped
otherwise. The package is the wheel installed by ``installed`` (tests/deploy/conftest.py).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import load_config
from prefetchd.layout import Layout
from tests.deploy.conftest import Installed

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("useradd") is None,
        reason="needs root and useradd to create a normal user to run as",
    ),
]

TIMEOUT = 180  # s, a one-epoch job of a few small objects

TRAINER = """
import sys
from prefetchd import ready_files
from prefetchd.tfrecord import read_records

records = 0
for path in ready_files(sys.argv[1], timeout=60, grace=float(sys.argv[2])):
    with open(path, "rb") as f:
        records += sum(1 for _ in read_records(f))
print(records)
"""


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def env(self, installed: Installed) -> dict[str, str]:
        """What a login gives this user: their HOME, no XDG_* variables of root's session."""
        env = installed.env(HOME=str(self.home), USER=self.name, LOGNAME=self.name)
        return {k: v for k, v in env.items() if not k.startswith("XDG_")}

    def popen_args(self, installed: Installed) -> dict[str, Any]:
        return {
            "user": self.uid,
            "group": self.gid,
            "extra_groups": [],
            "env": self.env(installed),
            "cwd": self.home,
        }

    def run(self, installed: Installed, *args: str) -> subprocess.CompletedProcess[str]:
        """A program of the installed venv, run as this user."""
        return subprocess.run(
            [str(installed.bin / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            **self.popen_args(installed),
        )

    def write(self, name: str, text: str) -> Path:
        path = self.home / name
        path.write_text(text)
        os.chown(path, self.uid, self.gid)
        return path


@pytest.fixture
def user() -> Iterator[User]:
    name = f"pfd{uuid.uuid4().hex[:10]}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, timeout=60)
    entry = pwd.getpwnam(name)
    try:
        yield User(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    finally:
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)
        shutil.rmtree(f"/dev/shm/prefetchd-{entry.pw_uid}", ignore_errors=True)


def assert_no_traceback(proc: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "PermissionError" not in proc.stdout + proc.stderr


def test_minimal_config_checks_and_runs_as_a_normal_user(
    installed: Installed,
    user: User,
    upload: Callable[..., Any],
    bucket: str,
    s3_endpoint: str,
    daemons: list[subprocess.Popen[bytes]],
) -> None:
    data = upload("tfrecord", [4096, 64 * 1024, 300 * 1024])
    config = user.write(
        "job.yaml", f"source:\n  url: s3://{bucket}/data/\n  endpoint_url: {s3_endpoint}\n"
    )
    check = user.run(installed, "prefetchd", "check", "--config", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    assert_no_traceback(check)
    assert f"download.cache_dir {user.home}/.cache/prefetchd is writable" in check.stdout
    assert f"status.state_dir {user.home}/.local/state/prefetchd is writable" in check.stdout
    assert f"/dev/shm/prefetchd-{user.uid}" in check.stdout

    log = user.home / "daemon.log"
    with open(log, "wb") as out:
        daemon = subprocess.Popen(
            [str(installed.bin / "prefetchd"), "run", "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **user.popen_args(installed),
        )
    daemons.append(daemon)
    trainer = user.run(installed, "python", "-c", TRAINER, str(config), "60")
    assert trainer.returncode == 0, trainer.stderr + log.read_text()
    assert int(trainer.stdout) == data["records"]
    assert daemon.wait(TIMEOUT) == 0, log.read_text()
    ram = Path(f"/dev/shm/prefetchd-{user.uid}")
    assert ram.stat().st_uid == user.uid and ram.stat().st_mode & 0o777 == 0o700


def test_init_writes_a_config_that_checks_clean_as_a_normal_user(
    installed: Installed, user: User, upload: Callable[..., Any], bucket: str, s3_endpoint: str
) -> None:
    """A newcomer's first two commands: ``init`` for this host, then ``check`` with no size
    advice and no failure."""
    upload("tfrecord", [4096])
    config = user.home / "job.yaml"
    init = user.run(
        installed,
        "prefetchd",
        "init",
        "--url",
        f"s3://{bucket}/data/",
        "--endpoint-url",
        s3_endpoint,
        "--output",
        str(config),
    )
    assert init.returncode == 0, init.stderr
    assert config.stat().st_uid == user.uid
    check = user.run(installed, "prefetchd", "check", "--config", str(config))
    assert check.returncode == 0, check.stdout + check.stderr
    assert_no_traceback(check)
    sizing = ("output.ram_budget", "download.window", "download.concurrency", "output.writers")
    warned = [line for line in check.stdout.splitlines() if line.startswith("WARN")]
    assert not [line for line in warned if line.split()[1] in sizing], warned


def test_another_users_directories_are_one_line_each(
    installed: Installed, user: User, tmp_path: Path, write_config: Callable[..., Path]
) -> None:
    """What a normal user meets when the config names root's directories (the daemon runs as
    root): the trainer, ``check``, ``status`` and ``run`` each say which directory and why."""
    root_config = write_config(tmp_path / "root", epochs__count=1)
    layout = Layout.of(load_config(root_config))
    layout.create()  # as a root daemon leaves them: 0700, root's
    layout.ram.parent.chmod(0o755)  # the user can see the RAM directory, not use it
    config = user.write("job.yaml", root_config.read_text())

    trainer = user.run(installed, "python", "-c", TRAINER, str(config), "5")
    assert trainer.returncode == 1
    assert "PermissionError" not in trainer.stderr
    last = trainer.stderr.strip().splitlines()[-1]
    assert last.startswith("prefetchd.errors.RuntimeFailure: output.ram_dir ")
    assert f"{layout.ram}: permission denied: it belongs to root (uid 0)" in last
    assert f"not as {user.name} (uid {user.uid})" in last

    check = user.run(installed, "prefetchd", "check", "--config", str(config))
    assert check.returncode == 1
    assert_no_traceback(check)
    fails = [line for line in check.stdout.splitlines() if line.startswith("FAIL")]
    assert any("output.ram_dir" in line and "another user" in line for line in fails), fails

    for command in ("status", "run"):
        proc = user.run(installed, "prefetchd", command, "--config", str(config))
        assert proc.returncode == 1, proc.stderr
        assert_no_traceback(proc)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("prefetchd: "), proc.stderr
