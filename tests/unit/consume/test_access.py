"""check_trainer_access: a trainer that may not use the daemon's directories gets one line naming
the directory and its owner (tests/deploy/test_normal_user.py does it as a real second user)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from prefetchd.consume import access
from prefetchd.errors import RuntimeFailure
from prefetchd.layout import Layout


def layout(tmp_path: Path) -> Layout:
    return Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")


def test_directories_not_created_yet_are_fine(tmp_path: Path) -> None:
    access.check_trainer_access(layout(tmp_path))  # the daemon may still be starting


def test_our_own_directories_are_fine(tmp_path: Path) -> None:
    lay = layout(tmp_path)
    lay.create()
    access.check_trainer_access(lay)


def test_another_users_ram_dir_is_one_line_naming_it_and_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lay = layout(tmp_path)
    lay.create()
    denied = {str(lay.ram)}
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: str(p) not in denied and real_access(p, mode))
    monkeypatch.setattr(os, "geteuid", lambda: 4242)  # we are someone else
    with pytest.raises(RuntimeFailure) as err:
        access.check_trainer_access(lay)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"output.ram_dir {lay.ram}: permission denied: it belongs to")
    assert f"(uid {os.stat(lay.ram).st_uid})" in message and "uid 4242" in message
