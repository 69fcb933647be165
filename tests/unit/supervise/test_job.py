"""Which job a starting daemon runs, and what it says: resumed only for the same unfinished
job; otherwise a new job with a new id, naming what changed (``supervise/job.py``)."""

from __future__ import annotations

import dataclasses
import json

from prefetchd.config import Config
from prefetchd.layout import Layout
from prefetchd.supervise.job import changes, decide, save_job


def test_no_earlier_job_starts_a_new_one_saying_so(config: Config, layout: Layout) -> None:
    start = decide(layout, config.job_fingerprint())
    assert not start.resume and len(start.job) == 16
    note = start.note(epoch=0, count=2, removed=3)
    assert note.startswith(f"starting a new job {start.job} (no earlier job in status.state_dir")
    assert "3 shards another job left in output.ram_dir were removed" in note


def test_the_same_unfinished_job_resumes_under_its_id(config: Config, layout: Layout) -> None:
    first = decide(layout, config.job_fingerprint())
    save_job(layout, first)
    again = decide(layout, config.job_fingerprint())
    assert again.resume and again.job == first.job
    assert again.note(epoch=1, count=2, removed=0) == f"resuming job {first.job} at epoch 1 of 2"


def test_a_changed_seed_starts_a_new_job_naming_the_change(config: Config, layout: Layout) -> None:
    first = decide(layout, config.job_fingerprint())
    save_job(layout, first)
    seeded = dataclasses.replace(config, epochs=dataclasses.replace(config.epochs, seed=1))
    start = decide(layout, seeded.job_fingerprint())
    assert not start.resume and start.job != first.job
    assert start.note(epoch=0, count=2, removed=4) == (
        f"starting a new job {start.job} (epochs.seed changed 0 -> 1; the old job's state and 4 "
        "shards were removed)"
    )


def test_a_finished_job_is_never_resumed(config: Config, layout: Layout) -> None:
    first = decide(layout, config.job_fingerprint())
    save_job(layout, first)
    job = json.loads(layout.job_file.read_text())
    layout.job_file.write_text(json.dumps({**job, "finished": True}))
    start = decide(layout, config.job_fingerprint())
    assert not start.resume and start.job != first.job
    assert f"the previous job {first.job} finished" in start.note(epoch=0, count=2, removed=0)


def test_a_job_of_an_earlier_release_without_an_id_resumes_with_a_new_one(
    config: Config, layout: Layout
) -> None:
    fingerprint = config.job_fingerprint()
    layout.job_file.write_text(json.dumps({"fingerprint": fingerprint, "finished": False}))
    start = decide(layout, fingerprint)
    assert start.resume and len(start.job) == 16


def test_changes_name_each_key_as_the_config_does() -> None:
    old = {"url": "s3://a/x/", "epochs": [2, True, 0], "writers": 2}
    new = {"url": "s3://a/y/", "epochs": [3, True, 0], "writers": 2}
    assert changes(old, new) == [
        "source.url changed s3://a/x/ -> s3://a/y/",
        "epochs.count changed 2 -> 3",
    ]
    assert changes(None, {"writers": 2}) == ["output.writers changed null -> 2"]
