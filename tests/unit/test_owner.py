"""One owner per directory (docs/reliability.md invariant 7): ``owner.claim_dirs`` and
``check``'s view."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from prefetchd.config import Config, config_from_dict
from prefetchd.errors import EXIT_FAILURE, RuntimeFailure
from prefetchd.layout import OWNER_FILE, Layout
from prefetchd.owner import claim_dirs, dir_findings, read_owner


def make_config(tmp_path: Path, state: str, *, ram: str = "ram", cache: str = "cache") -> Config:
    return config_from_dict(
        {
            "source": {"url": "s3://bucket/data/"},
            "download": {"cache_dir": cache},
            "output": {"ram_dir": ram},
            "status": {"state_dir": state},
        },
        base_dir=tmp_path,
    )


def mode_of(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_new_directories_are_created_private_marked_and_locked(tmp_path: Path) -> None:
    config = make_config(tmp_path, "state")
    layout = Layout.of(config)
    owned = claim_dirs(layout, config)
    try:
        for _, path in layout.roots():
            assert mode_of(path) == 0o700
            owner = read_owner(path)
            assert owner is not None and owner.pid == os.getpid() and owner.created
            assert owner.state_dir == str(layout.state)
    finally:
        owned.close()


@pytest.mark.parametrize("shared", ["ram", "cache"])
def test_a_second_daemon_naming_a_held_directory_is_refused_with_the_owner(
    tmp_path: Path, shared: str
) -> None:
    first = make_config(tmp_path, "state1")
    owned = claim_dirs(Layout.of(first), first)
    try:
        other = {"ram": "ram2", "cache": "cache2", shared: shared}
        second = make_config(tmp_path, "state2", ram=other["ram"], cache=other["cache"])
        with pytest.raises(RuntimeFailure) as info:
            claim_dirs(Layout.of(second), second)
        message = str(info.value)
        assert info.value.exit_code == EXIT_FAILURE  # as a second run of one config
        assert "another prefetchd is already running" in message
        assert str(tmp_path / shared) in message and f"pid {os.getpid()}" in message
        assert "\n" not in message
        # the refused daemon let go of what it had taken: a third one may have state2
        alone = make_config(tmp_path, "state2", ram="ram3", cache="cache3")
        claim_dirs(Layout.of(alone), alone).close()
    finally:
        owned.close()


def test_a_restart_of_the_same_config_takes_its_directories_back_keeping_the_token(
    tmp_path: Path,
) -> None:
    config = make_config(tmp_path, "state")
    layout = Layout.of(config)
    first = claim_dirs(layout, config)
    tokens = first.tokens()
    first.close()  # as a SIGKILL would: the locks go with the process
    second = claim_dirs(layout, config)
    try:
        assert second.tokens() == tokens
        ram = second.get("output.ram_dir")
        assert ram is not None and ram.intact()
    finally:
        second.close()


def test_an_emptied_ram_dir_gets_a_new_token(tmp_path: Path) -> None:
    config = make_config(tmp_path, "state")
    layout = Layout.of(config)
    first = claim_dirs(layout, config)
    old = first.tokens()["output.ram_dir"]
    first.close()
    for name in os.listdir(layout.ram):
        os.unlink(layout.ram / name)
    second = claim_dirs(layout, config)
    try:
        assert second.tokens()["output.ram_dir"] != old
    finally:
        second.close()


def test_a_foreign_non_empty_directory_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    foreign = tmp_path / "ram"
    foreign.mkdir(mode=0o750)
    (foreign / "photo.jpg").write_bytes(b"mine")
    config = make_config(tmp_path, "state")
    with pytest.raises(RuntimeFailure) as info:
        claim_dirs(Layout.of(config), config)
    assert "output.ram_dir" in str(info.value) and "photo.jpg" in str(info.value)
    assert sorted(os.listdir(foreign)) == ["photo.jpg"]
    assert (foreign / "photo.jpg").read_bytes() == b"mine"
    assert mode_of(foreign) == 0o750


def test_an_existing_empty_directory_is_adopted_without_changing_its_mode(tmp_path: Path) -> None:
    existing = tmp_path / "cache"
    existing.mkdir(mode=0o750)
    existing.chmod(0o750)
    config = make_config(tmp_path, "state")
    layout = Layout.of(config)
    owned = claim_dirs(layout, config)
    try:
        layout.create()
        assert mode_of(existing) == 0o750
        assert mode_of(layout.cache_ready) == 0o700  # what we make is private
        owner = read_owner(existing)
        assert owner is not None and not owner.created
    finally:
        owned.close()


def test_a_directory_others_can_write_is_refused_not_chmodded(tmp_path: Path) -> None:
    shared = tmp_path / "ram"
    shared.mkdir()
    shared.chmod(0o777)
    config = make_config(tmp_path, "state")
    with pytest.raises(RuntimeFailure) as info:
        claim_dirs(Layout.of(config), config)
    assert "writable by other users" in str(info.value)
    assert mode_of(shared) == 0o777
    assert not (shared / OWNER_FILE).exists()


def test_a_directory_of_an_older_release_without_a_marker_is_adopted(tmp_path: Path) -> None:
    old = tmp_path / "ram"
    for sub in ("ready", "claimed", ".tmp", "consumers"):
        (old / sub).mkdir(parents=True, mode=0o700)
    (old / ".budget.lock").write_bytes(b"")
    config = make_config(tmp_path, "state")
    owned = claim_dirs(Layout.of(config), config)
    owned.close()


def test_a_directory_of_a_stopped_daemon_with_another_state_dir_is_taken_over(
    tmp_path: Path,
) -> None:
    first = make_config(tmp_path, "state1")
    taken = claim_dirs(Layout.of(first), first)
    old = taken.tokens()["output.ram_dir"]
    taken.close()
    second = make_config(tmp_path, "state2", cache="cache2")
    owned = claim_dirs(Layout.of(second), second)
    try:
        # a new token: the first job, restarted, must not trust what it finds there
        assert owned.tokens()["output.ram_dir"] != old
    finally:
        owned.close()


def test_check_reports_a_directory_held_by_another_daemon(tmp_path: Path) -> None:
    first = make_config(tmp_path, "state1")
    owned = claim_dirs(Layout.of(first), first)
    try:
        second = make_config(tmp_path, "state2", cache="cache2")
        findings = list(dir_findings(Layout.of(second)))
        assert any(
            level == "fail" and "another prefetchd is already running" in text and "ram" in text
            for level, text in findings
        ), findings
        own = list(dir_findings(Layout.of(first)))
        assert own and all(level == "ok" for level, _ in own), own
    finally:
        owned.close()


def test_check_reports_a_foreign_directory_and_changes_nothing(tmp_path: Path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "notes.txt").write_text("x")
    findings = list(dir_findings(Layout.of(make_config(tmp_path, "state"))))
    assert [t for level, t in findings if level == "fail" and "notes.txt" in t], findings
    assert os.listdir(tmp_path / "cache") == ["notes.txt"]
