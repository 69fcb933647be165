"""The host's budgets on the real daemon (issue 27, item 2): with ``download.max_requests_per_s``
and ``download.max_bytes_per_s`` set, the requests and bytes the store sees over any stretch of
time stay within them (a token bucket: the rate, plus one second's burst), with either client,
and the epoch still arrives exactly once."""

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
PROXY_SEED = 6  # the fault proxy's (the `proxy` fixture's)

KIB = 1024
SIZES = [30 * KIB + 509 * i for i in range(40)]  # single GETs
REQUESTS_PER_S = 10.0
BYTES_PER_S = 256 * KIB
SPAN_S = 2.0  # the stretches checked: every request's next SPAN_S seconds


@pytest.mark.parametrize("client", ["classic", "crt", "native"])
def test_requests_and_bytes_keep_the_hosts_budgets(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=28)
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        epochs__count=1,
        download={
            "client": client,
            "max_requests_per_s": REQUESTS_PER_S,
            "max_bytes_per_s": BYTES_PER_S,
        },
    )
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    result = finish_reader(start_reader(config, out), out)
    assert daemon.wait(120) == 0, daemon.output()
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"

    sizes = dataset["sizes"]
    gets = sorted((r.at, sizes.get(r.key, 0)) for r in proxy.timeline() if not r.listing)
    assert len(gets) >= len(SIZES)
    most_requests = most_bytes = 0.0
    for i, (start, _) in enumerate(gets):
        span = [size for at, size in gets[i:] if at < start + SPAN_S]
        most_requests = max(most_requests, len(span))
        most_bytes = max(most_bytes, sum(span))
    # A token bucket: the rate over the span plus one second's burst (+1: the request that
    # took the bucket into debt, a byte budget's whole object).
    assert most_requests <= REQUESTS_PER_S * (SPAN_S + 1) + 1, most_requests
    assert most_bytes <= BYTES_PER_S * (SPAN_S + 1) + max(SIZES), most_bytes
    status = read_status(config)
    assert status is not None and status["budget_wait_s"] > 0, "nothing was held back"
    assert status["max_requests_per_s"] == REQUESTS_PER_S
    assert status["max_bytes_per_s"] == BYTES_PER_S
