"""bench.profile.floor: its C program builds and runs every mode in fresh directories, which
are gone afterwards; an unknown mode is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.profile.floor import MODES, build, parse_args, run_once


def test_every_mode_runs_and_leaves_nothing_behind(tmp_path: Path) -> None:
    binary = build(tmp_path)
    parent = tmp_path / "caches"
    parent.mkdir()
    args = parse_args(["--objects", "50", "--size", "4096"])
    for mode in MODES:
        downloader, writer = run_once(binary, mode, args, parent)
        assert downloader > 0 and writer > 0, mode
    assert list(parent.iterdir()) == []


def test_an_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--modes", "files,bogus"])
    assert exc.value.code == 2
    assert "--modes: unknown bogus" in capsys.readouterr().err
