"""The releaser's read-state machine alone, without files, inotify or threads: a claim is read
once this process held it and holds it no more, never because another process opened and
closed it, and a resumable stream's claim is never retired by it."""

from __future__ import annotations

from prefetchd.consume.reads import ClaimReads


def reads_of(*names: str, retain: bool = False) -> ClaimReads:
    reads = ClaimReads()
    for name in names:
        reads.track(name, retain=retain)
    return reads


def test_a_claim_held_then_closed_is_read() -> None:
    reads = reads_of("a")
    assert reads.seen({"a"}, set(), held={"a"}) == []
    assert reads.seen({"a"}, {"a"}, held=set()) == ["a"]
    assert len(reads) == 0


def test_a_claim_closed_before_it_was_seen_open_is_doubtful_not_read() -> None:
    reads = reads_of("a")
    assert reads.seen({"a"}, {"a"}, held=set()) == []
    assert reads.has_doubtful() and "a" in reads


def test_a_doubtful_claim_is_read_once_a_later_claim_is_being_read() -> None:
    reads = reads_of("a", "b")
    reads.seen({"a"}, {"a"}, held=set())
    assert reads.seen({"b"}, set(), held={"b"}) == ["a"]


def test_a_doubtful_claim_stays_while_only_earlier_claims_are_read() -> None:
    reads = reads_of("earlier", "catted")
    reads.seen({"catted"}, {"catted"}, held=set())
    assert reads.seen({"earlier"}, set(), held={"earlier"}) == []
    assert reads.seen({"earlier"}, {"earlier"}, held=set()) == ["earlier"]
    assert "catted" in reads


def test_wanting_more_reads_the_doubtful_claims_not_held_now() -> None:
    reads = reads_of("a", "b")
    reads.seen({"a", "b"}, {"a", "b"}, held=set())
    assert reads.doubtful_not_held({"b"}) == ["a"]
    assert reads.doubtful_not_held(set()) == ["b"]
    assert not reads.has_doubtful()


def test_a_resync_trusts_the_open_files_and_keeps_what_it_never_saw_open() -> None:
    reads = reads_of("reading", "unseen")
    reads.seen({"reading"}, set(), held={"reading"})
    assert reads.resync(held=set()) == ["reading"]
    assert "unseen" in reads  # opened and closed within lost events: kept, never lost


def test_a_retained_claim_found_read_is_forgotten_but_not_retired() -> None:
    reads = reads_of("kept", retain=True)
    reads.seen({"kept"}, set(), held={"kept"})
    assert reads.seen({"kept"}, {"kept"}, held=set()) == []
    assert len(reads) == 0


def test_finished_reads_a_tracked_claim_in_any_state_and_nothing_else() -> None:
    reads = reads_of("a")
    assert reads.finished("a") == ["a"]
    assert reads.finished("a") == []
    assert reads.finished("never") == []
