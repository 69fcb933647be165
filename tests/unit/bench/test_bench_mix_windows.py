"""bench.studies.mix_windows' core: the real ``Mixer`` over a synthetic epoch of three sources of
tests/e2e/test_mixed_sources.py's shape (objects of 20-40, 1 and 10-30 records, weights
0.6/0.3/0.1 over bytes), in the real download order, two writers at ``output.mix`` 64, read as a
trainer reads their shards: issue 26's local bar."""

from __future__ import annotations

from collections import Counter

from bench.studies import mix_windows as study
from prefetchd.messages.shard_mix import ShardMix
from prefetchd.write.composition import Composition


def test_windows_of_records_hold_each_source_close_to_its_share_of_the_epoch() -> None:
    """Four times the test's objects (~35,000 records): every window of 10,000 records within
    1 point of the epoch's shares, every window of 1,000 within 3 (measured 0.2 and 2.1)."""
    got = study.run(draw="source", scale=4, epochs=1)
    assert got.records > 30000
    assert max(got.worst_10k) <= 0.01, got
    assert max(got.worst_1k) <= 0.03, got


def test_the_uniform_draw_and_an_unbalanced_split_miss_that_bar() -> None:
    """The two causes, each alone: a draw uniform across open objects (a source's share
    follows how many of its objects are open) and a split of the objects between writers that
    is left to chance (each writer's share drifts)."""
    uniform = study.run(draw="uniform", scale=4, epochs=1)
    merged = study.run(draw="source", scale=4, epochs=1, balanced=False)
    assert max(uniform.worst_1k) > 0.06, uniform
    assert max(merged.worst_1k) > 0.06, merged


def test_every_record_is_written_once_whatever_the_draw() -> None:
    shape = study.Shape()
    order = study.download_order(study.make_sources(shape, 5), shape, 5, 0)
    want = Counter({a.seq: a.count for a in order})
    for draw in study.DRAWS:
        for supply in (float("inf"), 0.5):
            sims = study.writer_sims(order, draw=draw, supply=supply, seed=5)
            study.run_writers(sims, 64, 0)
            got = Counter(seq for sim in sims for seq in sim.taken)
            assert got == want, (draw, supply)


def test_with_one_source_the_draw_is_what_it_was() -> None:
    """One source: the writers' records come in the very order of the uniform draw."""
    shape = study.Shape(
        objects=(200,), records=((1, 40),), record_bytes=((100, 900),), weights=(1,)
    )
    order = study.download_order(study.make_sources(shape, 9), shape, 9, 0)
    taken = []
    for draw in ("source", "uniform"):
        sims = study.writer_sims(order, draw=draw, mix=16, seed=9)
        study.run_writers(sims, 16, 0)
        taken.append([list(sim.taken) for sim in sims])
    assert taken[0] == taken[1]


def test_a_shard_mix_names_the_object_of_every_record_drawn_by_source() -> None:
    """What the writer tells its shard's mix, step by step (the draws by source, their credits
    brought to the draws used whenever the open objects change), gives back the object of
    every record written: what a position's ``objects`` counts on."""
    shape = study.Shape()
    order = study.download_order(study.make_sources(shape, 4), shape, 4, 0)[:300]
    (sim,) = study.writer_sims(order, writers=1, mix=16, seed=4)
    sim.composition = Composition()
    study.run_writers([sim], 16, 0)
    assert any(step[5] is not None for step in sim.composition.steps)
    mix = ShardMix.decode(sim.composition.mix([], sim.mixer.finished).encode())
    names = [f"e00000-{seq:09d}" for seq in sim.taken]
    for k in (0, 1, 17, 250, 1000, len(names) // 2, len(names)):
        assert mix.trained(k) == Counter(names[:k]), k
