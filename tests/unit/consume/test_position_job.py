"""The ``job`` a saved position carries (consume/position_format.py): with several sources it
covers every source, its weight and the schedule, so a position never resumes another mix;
with one source it hashes what it always did, so positions saved before still load."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from prefetchd.config import config_from_dict
from prefetchd.consume.position_format import check_job, job_for
from prefetchd.errors import PositionError
from prefetchd.exactly_once.trained_objects import job_tag


def mixed(weight: float = 0.3, **epochs: Any) -> dict[str, Any]:
    return {
        "sources": [
            {"url": "s3://bucket/web/", "weight": 0.6, "name": "web"},
            {"url": "s3://bucket/code/", "weight": weight, "name": "code", "format": "raw"},
        ],
        "epochs": epochs,
    }


def test_one_sources_tag_is_what_it_was() -> None:
    config = config_from_dict({"source": {"url": "s3://bucket/data/"}})
    before = ["s3://bucket/data/", None, ["*"], "tfrecord", None]
    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert job_tag(config, None)["dataset"] == digest


@pytest.mark.parametrize(
    "other",
    [
        mixed(weight=0.4),
        mixed(on_exhausted="stop"),
        mixed(weights_by_epoch=[{"epoch": 1, "weights": {"web": 1, "code": 1}}]),
    ],
)
def test_a_position_of_another_mix_is_refused(other: dict[str, Any]) -> None:
    saved = {"job": job_for(config_from_dict(mixed()))}
    check_job(saved, job_for(config_from_dict(mixed())))
    with pytest.raises(PositionError, match="another dataset"):
        check_job(saved, job_for(config_from_dict(other)))
