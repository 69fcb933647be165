"""Where a spawned child's start-up CPU goes, phase by phase (bar 6: start-up to the first GET).

    python -m bench.profile.startup [--dataset small] [--repeats 7] [--port 19400]

Starts SeaweedFS on 127.0.0.1 (``--port`` and the next 8 ports), uploads the dataset
(``bench.profile.download``'s), then ``--repeats`` times, each in a fresh interpreter, does
what a spawned downloader and a spawned writer do before they work, timing each phase with
``time.process_time()``:

- ``main``: the main module again, as multiprocessing's spawn does (``__mp_main__``, here
  ``prefetchd/__main__.py`` as under ``python -m prefetchd``), and what unpickling the role's
  entry imports;
- ``import``: the role's modules;
- downloader only: ``client`` (the S3 client), ``listing`` (the whole listing into a
  ``ShareTable``), ``transfer`` (the crt transfer).

Prints the median and the minimum of each phase, in CPU seconds. Run it from each tree to
compare (``PYTHONPATH`` and working directory set to it), alternating. Everything it starts is
stopped by PID.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from typing import Any

ROLES = ("downloader", "writer")
BUCKET = "measure"  # bench.profile.download's (not imported here: see main())


def phases(role: str, endpoint: str, prefix: str) -> dict[str, float]:
    """One child's start-up, in this (fresh) interpreter: CPU seconds per phase."""
    marks = [("start", time.process_time())]

    def mark(name: str) -> None:
        marks.append((name, time.process_time()))

    import runpy

    runpy.run_module("prefetchd.__main__", run_name="__mp_main__")
    import prefetchd.roles.shell
    import prefetchd.roles.table  # what unpickling the entry imports

    mark("main")
    from prefetchd.config import config_from_dict

    source = {"url": f"s3://{BUCKET}/{prefix}", "endpoint_url": endpoint, "format": "raw"}
    config = config_from_dict({"source": source, "download": {"client": "crt"}})
    if role == "writer":
        import prefetchd.write.writer  # noqa: F401

        mark("import")
    else:
        _downloader_phases(config, mark)
    return {b[0]: b[1] - a[1] for a, b in itertools.pairwise(marks)}


def _downloader_phases(config: Any, mark: Any) -> None:
    import prefetchd.download.downloader  # noqa: F401
    from prefetchd.download.share import ShareTable
    from prefetchd.download.store import list_share, make_client
    from prefetchd.download.transfer import make_transfer

    mark("import")
    client = make_client(config, pool=8)
    mark("client")
    ShareTable.of(list_share(client, config))
    mark("listing")
    make_transfer(config, lambda _job: None).shutdown()
    mark("transfer")


def run_once(role: str, endpoint: str, prefix: str) -> dict[str, float]:
    import subprocess

    cmd = [sys.executable, "-m", "bench.profile.startup", "_phases", role, endpoint, prefix]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout
    result: dict[str, float] = json.loads(out.splitlines()[-1])
    return result


def summary(runs: list[dict[str, float]]) -> str:
    """``phase median (min)`` for each phase, and their total (pure)."""
    import statistics

    names = list(runs[0])
    totals = [sum(r.values()) for r in runs]
    parts = [
        f"{n} {statistics.median(r[n] for r in runs):.3f} ({min(r[n] for r in runs):.3f})"
        for n in names
    ]
    return ", ".join([*parts, f"total {statistics.median(totals):.3f} ({min(totals):.3f})"])


def harness(args: Any) -> int:
    import os

    from bench.harness.environment import bench_env
    from bench.profile.download import DATASETS, upload
    from testkit.seaweedfs import start_seaweedfs

    env = bench_env(f"http://127.0.0.1:{args.port}")
    os.environ.clear()
    os.environ.update(env)
    server = start_seaweedfs(args.port)
    try:
        ds = DATASETS[args.dataset]
        upload(server.endpoint, ds)
        runs: dict[str, list[dict[str, float]]] = {role: [] for role in ROLES}
        for _ in range(args.repeats):  # alternating, so a busy moment hits both roles
            for role in ROLES:
                runs[role].append(run_once(role, server.endpoint, f"{ds.name}/"))
        print(f"# {ds.name}: {ds.objects} objects; CPU s, median (min) of {args.repeats}")
        for role in ROLES:
            print(f"{role:10s} {summary(runs[role])}", flush=True)
    finally:
        server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The harness, or (``_phases``) one measured child: that path imports nothing of the
    bench's, so the modules a child needs are not already loaded when it is timed."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_phases":
        print(json.dumps(phases(*argv[1:4])))
        return 0
    import argparse

    from bench.profile.download import DATASETS

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", default="small", choices=sorted(DATASETS))
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--port", type=int, default=19400, help="S3 port; +1..+8 used too")
    return harness(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
