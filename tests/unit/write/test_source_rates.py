"""The estimates behind the writers' draw by source (``write/source_rates.py``), and what a
commit in the replayable order keeps of them: a writer restarted from the commit reopens only
the objects open then, so it must be given back the figures the uninterrupted writer had, or
its draws (and so the order) part from the uninterrupted run's at the restart."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

from prefetchd.write.frames import EMPTY, Frames
from prefetchd.write.objects import OpenObject
from prefetchd.write.source_rates import RATE_SCALE, SourceRates


def obj(name: str, source: int, size: int) -> OpenObject:
    return OpenObject(
        name, name, 0, Path(name), iter(()), meta={"size": size}, source=source, frames=EMPTY
    )


def frames(records: int, size: int) -> Frames:
    ends = array("Q", [(i + 1) * size for i in range(records)])
    return Frames.of(bytes(records * size), ends)


def test_rates_follow_bytes_opened_times_records_per_byte() -> None:
    rates = SourceRates()
    web, code = obj("w", 0, 4000), obj("c", 1, 1000)
    for o in (web, code):
        rates.opened_object(o)
    rates.batch(web, frames(10, 400))  # 1 record per 400 bytes
    rates.batch(code, frames(10, 100))  # 1 record per 100 bytes
    raw = rates.rates(0, [0, 1])
    assert raw is not None
    web_rate, code_rate = array("Q", raw)
    # 4000/400 = 10 records of web for 1000/100 = 10 of code: equal rates
    assert abs(web_rate - code_rate) <= 1 and abs(web_rate + code_rate - RATE_SCALE) <= 2
    assert SourceRates().rates(0, [0, 1]) is None  # no estimate yet: the uniform draw


def test_a_commit_keeps_the_figures_a_restarted_writer_could_not_count_again() -> None:
    before = SourceRates()
    drained, web, code = obj("d", 0, 4000), obj("w", 0, 4000), obj("c", 1, 1000)
    for o in (drained, web, code):
        before.opened_object(o)
    before.batch(drained, frames(10, 400))
    before.drained(drained)
    before.batch(web, frames(5, 400))
    before.batch(web, frames(5, 400))
    before.batch(code, frames(10, 100))
    saved = json.loads(json.dumps(before.state([web, code])))  # through the journal's JSON

    after = SourceRates()  # the restarted writer: only the open objects, counted afresh
    web2, code2 = obj("w", 0, 4000), obj("c", 1, 1000)
    for o in (web2, code2):
        after.opened_object(o)
    after.batch(web2, frames(5, 400))
    after.batch(code2, frames(10, 100))
    assert after.rates(0, [0, 1]) != before.rates(0, [0, 1])  # what the fix is for

    after.restore(saved, [web2, code2])
    assert after.rates(0, [0, 1]) == before.rates(0, [0, 1])
    assert (web2.seen_records, web2.seen_bytes) == (web.seen_records, web.seen_bytes)
    after.restore(None, [web2])  # a commit of a job of one source saved none: nothing changes
    assert after.rates(0, [0, 1]) == before.rates(0, [0, 1])
