"""An outage of the object store mid-epoch (issue 29, items 4 and 6): every connection reset
for 25 s. ``status`` says so first, with the time it began, and the metrics show it; the
verdict is back to normal at the next status record once the store answers; downloads resume
at once (a probe ends the pause) instead of at the end of the backoff; nothing is lost."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import delivered
from tests.faults.faultkit import finish_reader, read_status, start_reader, wait_status
from tests.faults.faultproxy import FaultProxy

pytestmark = pytest.mark.e2e
PROXY_SEED = 3  # the fault proxy's (the `proxy` fixture's)

KIB = 1024
SIZES = [40 * KIB + 997 * i for i in range(48)]  # 48 small objects: single GETs
OUTAGE_S = 25.0
BEFORE = 12  # object GETs that get through before the store goes down
STATUS_PERIOD = 1.0 + 0.5 + 0.5  # the supervisor's status, a child's report, one poll
_PAUSE = re.compile(r"^(\S+ \S+) WARNING .*pausing downloads for ([0-9]+)s")


class StatusLog:
    """Every status record the daemon writes, read on a thread while the test runs."""

    def __init__(self, config: Path) -> None:
        self.config = config
        self.records: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> StatusLog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            status = read_status(self.config)
            if status is not None and (
                not self.records or status["updated"] != self.records[-1]["updated"]
            ):
                self.records.append(status)


def local_time(stamp: str) -> float:
    """A log line's ``asctime`` (local time) as Unix time."""
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def status_text(config: Path) -> str:
    return subprocess.run(
        [sys.executable, "-m", "prefetchd", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout


@pytest.mark.parametrize("client", ["classic", "crt", "native"])
def test_an_outage_is_the_verdict_first_and_downloads_resume_at_once_after_it(
    client: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    proxy: FaultProxy,
) -> None:
    dataset = upload("tfrecord", SIZES, seed=29)
    config = write_config(
        tmp_path,
        source__endpoint_url=proxy.url,
        epochs__count=1,
        download__client=client,
        download__window="1MiB",  # the epoch is still downloading when the store goes down
        download__concurrency=4,
    )
    proxy.down_after = BEFORE
    daemon = run_daemon(config)
    out = tmp_path / "trainer.json"
    reader = start_reader(config, out)
    with StatusLog(config) as statuses:
        down = wait_status(
            config,
            lambda s: s.get("store_unreachable_since") is not None,
            OUTAGE_S - 5,
            "status to show the store unreachable",
        )
        text = status_text(config)  # during the outage
        time.sleep(max(0.0, proxy.down_at + OUTAGE_S - time.time()))
        proxy.down = False
        up_at = time.time()
        result = finish_reader(reader, out)
        assert daemon.wait(120) == 0, daemon.output()

    # Nothing lost, nothing doubled, nothing skipped.
    assert delivered([result]) == Counter(dataset["ids"]), "records lost or doubled"
    final = read_status(config)
    assert final is not None and final["objects_skipped"] == 0 and final["errors"] == 0

    # The verdict during the outage: first, dated from its beginning.
    since = down["store_unreachable_since"]
    assert proxy.down_at - 1 <= since <= up_at, (since, proxy.down_at)
    clock = time.strftime("%H:%M:%S", time.localtime(since))
    verdict = down["bottleneck"]
    assert verdict["verdict"] == "store-bound"
    assert verdict["summary"].startswith(f"the object store is unreachable since {clock}: ")
    assert re.search(r": [0-9]+ errors, last: \S", verdict["summary"]), verdict
    bottleneck_line = next(ln for ln in text.splitlines() if "bottleneck" in ln)
    assert "the object store is unreachable since" in bottleneck_line, text
    assert final["store_outages"] >= 1

    # Back to normal within one status period of the store's first answer.
    timeline = proxy.timeline()
    answered = [r.at for r in timeline if r.at >= up_at and 0 < r.status < 500]
    assert answered, "no request answered after the outage"
    late = [
        s for s in statuses.records
        if s["updated"] > answered[0] + STATUS_PERIOD and s.get("store_unreachable_since")
    ]  # fmt: skip
    assert not late, f"status still shows the outage: {late[0]['bottleneck']}"

    # Downloads resumed before the backoff would have let them: the last pause scheduled the
    # next attempt at (log time + delay); the first GET answered came before that.
    pauses = [
        (local_time(m.group(1)), int(m.group(2)))
        for ln in daemon.output(limit=10**7).splitlines()
        if (m := _PAUSE.match(ln))
    ]
    scheduled = [at + delay for at, delay in pauses if at < up_at]
    assert scheduled, "the downloads never paused during the outage"
    backoff_next = scheduled[-1]
    first_get = min(
        r.at for r in timeline if r.at >= up_at and not r.listing and r.status in (200, 206)
    )
    assert backoff_next > up_at, "the backoff ended by itself: the outage proves nothing"
    assert first_get < backoff_next, (first_get - up_at, backoff_next - up_at)
