"""A fleet behind one throttling store (issue 27, items 2 and 3): 8 daemons, each a host of one
job with a tiny share, start together behind a proxy that answers 503 SlowDown to requests above
``LIMIT`` a second. Their adaptive concurrency brings the aggregate request rate under
``LIMIT`` within 30 s, every epoch reaches the trainers exactly once over the fleet, and the
503s are counted in each daemon's status."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import delivered
from tests.faults.faultkit import finish_reader, read_status, start_reader
from tests.faults.faultproxy import FaultProxy

pytestmark = pytest.mark.e2e
PROXY_SEED = 5  # the fault proxy's (the `proxy` fixture's)

HOSTS = 8
LIMIT = 40  # requests a second the store grants the whole fleet
OBJECTS = 96 * HOSTS  # tiny TFRecord objects: one GET each, about 96 per host and epoch
EPOCHS = 2
SETTLE_S = 30.0
WINDOW_S = 5.0


def offered_rates(times: list[float], start: float, end: float) -> list[float]:
    """Requests arriving a second (throttled ones included), per ``WINDOW_S`` from ``start``."""
    rates = []
    t = start
    while t + WINDOW_S <= end:
        rates.append(sum(1 for x in times if t <= x < t + WINDOW_S) / WINDOW_S)
        t += WINDOW_S
    return rates


def test_a_fleet_behind_a_throttling_store_settles_under_its_rate_and_loses_nothing(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", [3000] * OBJECTS, seed=27)
    proxy.max_rate = LIMIT
    daemons, readers = [], []
    for host in range(HOSTS):
        config = write_config(
            tmp_path / f"host{host}",
            source__endpoint_url=proxy.url,
            sharding={"num_workers": HOSTS, "worker_index": host},
            epochs__count=EPOCHS,
            download__client="classic",
            output={"writers": 1, "shard_size": "64KiB", "ram_budget": "2MiB"},
        )
        daemons.append((config, run_daemon(config)))
    for config, _ in daemons:
        out = config.parent / "trainer.json"
        readers.append((start_reader(config, out, "--timeout", "300"), out))
    results = [finish_reader(proc, out, timeout=400) for proc, out in readers]
    for _, daemon in daemons:
        assert daemon.wait(60) == 0, daemon.output()

    # Every epoch exactly once over the fleet: each record on one host, none lost.
    for epoch in range(EPOCHS):
        assert delivered(results, epoch) == Counter(dataset["ids"]), f"epoch {epoch}"

    # The hosts started in turn: worker 0 at once, the others after their share of the spread.
    for host, (_, daemon) in enumerate(daemons):
        staggered = "before listing: hosts of the job start in turn" in daemon.output(10**7)
        assert staggered == (host > 0), f"host {host}"

    timeline = proxy.timeline()
    times = sorted(r.at for r in timeline)
    throttled = [r.at for r in timeline if r.fault == "throttled"]
    start, end = times[0], times[-1]
    early = offered_rates(times, start, start + SETTLE_S)
    settled = offered_rates(times, start + SETTLE_S, end)
    counted = 0
    for config, _ in daemons:
        status = read_status(config)
        assert status is not None and status["objects_skipped"] == 0 and status["errors"] == 0
        counted += status["throttled"]
    print(
        f"fleet: {len(times)} requests in {end - start:.0f} s, {len(throttled)} answered 503 "
        f"(status counts {counted}); offered requests/s per {WINDOW_S:.0f} s, first "
        f"{SETTLE_S:.0f} s: {[round(r) for r in early]}, after: {[round(r) for r in settled]}"
    )
    assert throttled, "the store never throttled: the test proves nothing"
    assert counted >= len(throttled) * 0.9, "503s not reported in status"
    assert settled, "the fleet finished within the settling time: nothing to judge"
    assert max(settled) <= LIMIT, "the fleet's request rate did not settle under the limit"
