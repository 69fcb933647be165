"""Default directories (prefetchd/paths.py): a config that names only ``source.url`` works for
root and for a normal user, and ``null`` means the same as leaving a key out."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefetchd import paths
from prefetchd.config import config_from_dict, load_config


@pytest.fixture
def as_user(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Resolve defaults as uid 1234 with HOME in tmp_path and no XDG variables."""
    monkeypatch.setattr(os, "geteuid", lambda: 1234)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_root_keeps_the_system_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    config = config_from_dict({"source": {"url": "s3://bucket/p/"}})
    assert config.download.cache_dir == Path("/var/cache/prefetchd")
    assert config.output.ram_dir == Path("/dev/shm/prefetchd")
    assert config.status.state_dir == Path("/var/lib/prefetchd")


def test_a_user_gets_directories_of_their_own(as_user: Path) -> None:
    config = config_from_dict({"source": {"url": "s3://bucket/p/"}})
    assert config.download.cache_dir == as_user / ".cache/prefetchd"
    assert config.output.ram_dir == Path("/dev/shm/prefetchd-1234")
    assert config.status.state_dir == as_user / ".local/state/prefetchd"


def test_xdg_variables_are_honoured_and_relative_ones_ignored(
    as_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/data/cache")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")  # the XDG spec: ignore it
    assert paths.default_cache_dir() == Path("/data/cache/prefetchd")
    assert paths.default_state_dir() == as_user / ".local/state/prefetchd"


def test_runtime_dir_is_used_only_without_dev_shm(
    as_user: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1234")
    assert paths.default_ram_dir() == Path("/dev/shm/prefetchd-1234")
    monkeypatch.setattr(paths, "SHM", as_user / "no-shm")
    assert paths.default_ram_dir() == Path("/run/user/1234/prefetchd")


def test_null_means_the_default(as_user: Path) -> None:
    dirs = {"cache_dir": None}
    config = config_from_dict(
        {
            "source": {"url": "s3://bucket/p/"},
            "download": dirs,
            "output": {"ram_dir": None},
            "status": {"state_dir": None},
        }
    )
    assert config == config_from_dict({"source": {"url": "s3://bucket/p/"}})


def test_a_minimal_config_file_loads(as_user: Path) -> None:
    """source.url and endpoint_url and nothing else: what the quick start writes."""
    path = as_user / "job.yaml"
    path.write_text("source:\n  url: s3://bucket/train/\n  endpoint_url: http://127.0.0.1:9000\n")
    config = load_config(path)
    assert config.source.endpoint_url == "http://127.0.0.1:9000"
    assert config.output.ram_dir == Path("/dev/shm/prefetchd-1234")
