"""prefetchd as a user installs it: an sdist and a wheel built from this checkout, the wheel
installed into a fresh virtualenv that does not see the test environment's packages.

Built once per session (about 30-60 s: the venv and the wheel's dependencies, which pip takes
from its cache after the first run). The venv lives in a world-readable temporary directory
on an interpreter every user may run, so tests can also start it as a normal user.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD_TIMEOUT = 300  # s, each step; pip may fetch the dependencies on a first run
# Variables that would make the installed package import this checkout or the test venv.
_LEAKS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PREFETCHD_NATIVE")


@dataclass(frozen=True)
class Installed:
    """A fresh venv with the built wheel installed; ``sdist`` and ``wheel`` are the files."""

    venv: Path
    sdist: Path
    wheel: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a process of the installed package: the test's AWS settings,
        nothing that points back at this checkout."""
        env = {k: v for k, v in os.environ.items() if k not in _LEAKS}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        return {**env, **extra}

    def run(
        self,
        *args: str,
        timeout: float = 120,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``args[0]`` is a program of the venv (``prefetchd``, ``python``). It runs outside the
        checkout by default (``python -c`` puts its working directory on ``sys.path``)."""
        return subprocess.run(
            [str(self.bin / args[0]), *args[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else self.env(),
            cwd=cwd or self.venv.parent,
        )


def _step(*command: str | Path, cwd: Path | None = None) -> str:
    proc = subprocess.run(
        [str(c) for c in command],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in _LEAKS}
        | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert proc.returncode == 0, f"{' '.join(map(str, command))} failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def copy_checkout(target: Path) -> None:
    """The files a release is made from (tracked or new, not ignored): the build then writes
    its build/ and egg-info there, not into the checkout, and sees no stray local files."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        timeout=60,
    )
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the release's files from local ones")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def base_interpreter() -> str:
    """A Python of this version that every user may run (the venv's base interpreter must be
    reachable for the normal-user tests): this one if its install is, else the system's."""
    candidates = [
        os.path.realpath(sys.executable),
        f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}",
    ]
    for candidate in candidates:
        if Path(candidate).exists() and _world_reachable(Path(candidate)):
            return candidate
    return sys.executable


def _world_reachable(path: Path) -> bool:
    return all(os.stat(p).st_mode & 0o001 for p in path.parents)


def _has_build_package() -> bool:
    """Whether ``python -m build`` runs here (a stray build/ directory on sys.path is a
    namespace package without ``__main__``)."""
    try:
        return importlib.util.find_spec("build.__main__") is not None
    except ModuleNotFoundError:
        return False


def build(src: Path, dist: Path) -> tuple[Path, Path]:
    """The sdist of ``src`` and a wheel built from that sdist alone (what pip does with a
    source release). With the ``build`` package (the dev extra) this is the documented
    ``python -m build``, in an isolated environment; without it, the same two PEP 517 steps
    with this venv's setuptools, offline."""
    python = sys.executable
    if _has_build_package():
        _step(python, "-m", "build", "--outdir", dist, src)
    else:
        hook = f"from setuptools import build_meta as b; b.build_sdist({str(dist)!r})"
        _step(python, "-c", hook, cwd=src)
        (sdist,) = dist.glob("prefetchd-*.tar.gz")
        _step(python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", dist, sdist)
    (sdist,) = dist.glob("prefetchd-*.tar.gz")
    (wheel,) = dist.glob("prefetchd-*.whl")
    return sdist, wheel


@pytest.fixture(scope="session")
def installed() -> Iterator[Installed]:
    top = Path(tempfile.mkdtemp(prefix="prefetchd-wheel-test-"))
    try:
        top.chmod(0o755)
        src, dist = top / "src", top / "dist"
        src.mkdir()
        copy_checkout(src)
        sdist, wheel = build(src, dist)
        venv = top / "venv"
        _step(base_interpreter(), "-m", "venv", venv)  # no --system-site-packages
        _step(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)
        yield Installed(venv, sdist, wheel)
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def daemons() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Daemons a test starts from the installed package (``daemons.append(proc)``); any still
    running at its end gets SIGTERM, then SIGKILL."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def sdist_names(sdist: Path) -> list[str]:
    """The sdist's file names without the ``prefetchd-<version>/`` directory."""
    with tarfile.open(sdist) as tar:
        return [m.name.partition("/")[2] for m in tar.getmembers() if m.isfile()]
