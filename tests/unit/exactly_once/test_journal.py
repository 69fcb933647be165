"""The writer commit journal's codec and who reads it (``exactly_once/journal.py``); the
resume rules for other versions are in ``tests/unit/supervise/test_messages.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefetchd.exactly_once.journal import (
    Journal,
    JournalEntry,
    JournalError,
    TornEntry,
    read_heads,
)
from prefetchd.layout import Layout

ENTRY = JournalEntry("e0-w0-3.tfrecord", 3, {"e00000-000000001-" + "ab" * 12: 5}, ("x",))


def test_an_entry_is_one_line_that_decodes_to_itself() -> None:
    data = ENTRY.encode()
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data)["version"] == JournalEntry.VERSION
    assert JournalEntry.decode(data) == ENTRY


def test_a_torn_line_is_told_apart_from_one_this_version_refuses() -> None:
    with pytest.raises(TornEntry):
        JournalEntry.decode(ENTRY.encode()[:20])
    newer = json.dumps({"version": JournalEntry.VERSION + 1}).encode()
    with pytest.raises(JournalError, match="newer than this"):
        JournalEntry.decode(newer)


def test_recovery_reads_the_last_entry_of_every_writer_that_committed(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    Journal(layout.journal_file(0)).append(ENTRY)
    later = JournalEntry(None, 4, {}, ())
    Journal(layout.journal_file(0)).append(later)
    Journal(layout.journal_file(2)).rewrite(ENTRY)
    layout.journal_file(1).write_bytes(b"")  # a writer that committed nothing
    layout.parse_attempts_file(0).write_text("{}")  # not a journal
    heads = read_heads(layout)
    assert sorted(heads) == [0, 2]
    assert heads[0].last == later and heads[0].journal.path == layout.journal_file(0)
    assert heads[2].last == ENTRY


def test_a_journal_recovery_cannot_read_names_its_file(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "cache", tmp_path / "ram", tmp_path / "state")
    layout.create()
    layout.journal_file(3).write_text(json.dumps({"version": 99}) + "\n")
    with pytest.raises(JournalError, match=str(layout.journal_file(3))):
        read_heads(layout)


def test_an_entry_keeps_the_replayable_orders_state_and_one_without_it_still_reads() -> None:
    """``epochs.order: replayable`` commits carry ``replay`` (write/replay.py); a line without
    it (a ``fast`` run, an older release) reads as before, with ``replay`` None."""
    state = {"next": [1, 7], "mixer": {"epoch": 1, "state": 2**63 + 5, "picks": [9, 40], "at": 3}}
    entry = JournalEntry("e1-w0-4.tfrecord", 5, {"a": 2, "b": 0}, ("c",), state)
    again = JournalEntry.decode(entry.encode())
    assert again == entry and list(again.positions) == ["a", "b"], "the order opened in"
    plain = JournalEntry("e0-w0-1.tfrecord", 2, {"a": 1}, ())
    assert b"replay" not in plain.encode()
    assert JournalEntry.decode(plain.encode()).replay is None
