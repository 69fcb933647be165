"""Regression (the soak's stall, on purpose): the last object of epoch 0 must be fetched again
while epoch 1 already fills the window and the RAM budget.

Its copies arrive corrupt (flipped bytes, MD5 does not match the ETag) and it is re-fetched,
0.5 s later each time. Meanwhile the downloader goes on with epoch 1. Before the fix the retry
gave up its room in ``download.window`` to epoch 1's objects, writers that moved on to epoch 1
filled the RAM budget with shards no trainer could read yet and waited in it holding those
objects, and epoch 0 never ended: the trainer gave up with "no new shard of epoch 0". The real
daemon against moto through the fault proxy, with budgets that bite (1 MiB each).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from prefetchd.download.order import epoch_permutation
from testkit.trainers import delivered
from tests.faults.faultkit import finish_reader, read_status, start_reader
from tests.faults.faultproxy import FaultProxy, Rule

pytestmark = pytest.mark.e2e

KIB = 1024
OBJECTS = 48
SEED = 0  # the test config's epochs.seed
PROXY_SEED = 5  # the fault proxy's (the `proxy` fixture's)


def test_epoch_0s_last_object_fetched_again_while_epoch_1_fills_the_budgets(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    rng = random.Random(5)
    sizes = [rng.choice([40, 130, 300]) * KIB for _ in range(OBJECTS)]
    # keys are numbered in upload order, which is the key order epochs are shuffled from
    last = epoch_permutation(OBJECTS, seed=SEED, epoch=0, shuffle=True)[-1]
    sizes[last] = 1200 * KIB  # larger than the window: fetched alone, once the window is empty
    dataset = upload("tfrecord", sizes, seed=5)
    assert dataset["keys"] == sorted(dataset["keys"])
    proxy.add(Rule("flip", key=dataset["keys"][last], times=2))
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        epochs__count=2,
        download__window="1MiB",
        output__ram_budget="1MiB",
        output__shard_size="128KiB",
        output__mix=8,
    )
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_reader(start_reader(config, out, "--timeout", "60"), out, timeout=300)
    for epoch in (0, 1):
        got, want = delivered([result], epoch), Counter(dataset["ids"])
        assert got == want, f"epoch {epoch}: lost {want - got}, doubled {got - want}"
    assert daemon.wait(120) == 0, daemon.output()
    status = read_status(config)
    assert status is not None
    assert status["integrity_failures"] >= 1, "the object was fetched again, as planned"
    assert status["objects_skipped"] == 0
