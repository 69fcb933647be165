"""Containers: ``check`` catches a /dev/shm smaller than the RAM budget (Docker gives 64 MiB) and
says how to grow it, and docker/Dockerfile builds an image that runs as a non-root user.

The image build needs a reachable Docker daemon (and the network for python:3.11-slim and the
wheel's dependencies); without one it is skipped and says why. The small-tmpfs test mounts a
64 MiB tmpfs, which needs root.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from prefetchd import __version__

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
DOCKER = shutil.which("docker")


def instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of a Dockerfile, continuation lines joined."""
    joined = text.replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def test_dockerfile_copies_only_what_exists_and_runs_unprivileged() -> None:
    steps = instructions(DOCKERFILE.read_text())
    bases = [args for op, args in steps if op == "FROM"]
    assert bases[-1] == "python:3.11-slim"
    for op, args in steps:
        if op == "COPY" and not args.startswith("--from"):
            for source in args.split()[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    (user,) = [args for op, args in steps if op == "USER"]
    assert user.isdigit() and int(user) != 0
    assert ("ENTRYPOINT", '["prefetchd"]') in steps
    assert ("CMD", '["run", "--config", "/etc/prefetchd/prefetchd.yaml"]') in steps


def test_check_says_how_to_grow_a_docker_sized_dev_shm(
    small_tmpfs: Callable[..., Path],
    tmp_path: Path,
    upload: Callable[..., object],
    write_config: Callable[..., Path],
) -> None:
    shm = small_tmpfs("64m", mode="1777", skip_unmountable=True)  # Docker's default /dev/shm
    upload("tfrecord", [4096])
    config = write_config(tmp_path, output={"ram_dir": str(shm / "ram"), "ram_budget": "4GiB"})
    proc = subprocess.run(
        [sys.executable, "-m", "prefetchd", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    fails = [line for line in proc.stdout.splitlines() if line.startswith("FAIL")]
    assert len(fails) == 1, proc.stdout
    assert "tmpfs of 64.0 MiB" in fails[0] and "--shm-size=5g" in fails[0]
    assert "medium: Memory" in fails[0] and "sizeLimit: 5Gi" in fails[0]


def _docker_answers() -> str | None:
    """Why the image cannot be built here, or None."""
    if DOCKER is None:
        return "docker is not installed"
    info = subprocess.run([DOCKER, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return "the Docker daemon does not answer (docker info failed)"
    return None


def test_image_builds_and_runs_as_a_normal_user() -> None:
    why = _docker_answers()
    if why:
        pytest.skip(f"{why}: docker/Dockerfile not built")
    assert DOCKER is not None
    tag = f"prefetchd-test:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(
        [DOCKER, "build", "-f", str(DOCKERFILE), "-t", tag, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    try:
        version = subprocess.run(
            [DOCKER, "run", "--rm", tag, "--version"], capture_output=True, text=True, timeout=120
        )
        assert version.stdout.strip() == f"prefetchd {__version__}", version.stderr
        uid = subprocess.run(
            [DOCKER, "run", "--rm", "--entrypoint", "id", tag, "-u"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert uid.stdout.strip() == "10001", uid.stderr
    finally:
        subprocess.run([DOCKER, "rmi", "-f", tag], capture_output=True, timeout=120)
