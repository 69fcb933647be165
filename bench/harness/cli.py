"""``python -m bench``: the command line, the network phases and the whole benchmark's run.

See the package docstring (``bench/__init__.py``) for what is measured. As root the benchmark
re-runs itself inside a private network namespace (``bench.harness.network``) before doing anything;
without root the loopback and paced phases run on the host's loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import bench
from bench.drivers.paced_proxy import paced_proxy
from bench.harness import contenders, datasets, layout, network, results
from bench.harness.environment import (
    INSTALL_HINT,
    ROOT,
    bench_env,
    compile_bytecode,
    log,
    machine_info,
    missing_packages,
    unavailable,
)
from bench.harness.runner import BUCKET, Bench, one_run, plan_runs
from bench.harness.store import STORES, start_store
from testkit.s3server import HOST, free_port

S3_PORT = 8333  # inside our own namespace nothing else listens; outside, a free port is used
PROXY_PORT = S3_PORT + 9  # the store takes S3_PORT .. S3_PORT + 8
REPEATS = 5  # the bars are judged on the median and the worst of these
QUICK_GIL_LOADERS = ("baseline", "prefetchd", "floor")  # --quick: the GIL measure for these
MiB = 1024**2
NETWORKS = {  # --network -> its phases, in order
    "bars": ["loopback", "paced"],
    "auto": ["loopback", "paced"],  # the default, as "bars"
    "loopback": ["loopback"],
    "paced": ["paced"],
    "shaped": ["shaped"],
    "both": ["loopback", "shaped"],
}


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # so every finally runs: store stopped, namespace deleted


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark as the arguments say; the exit code is 0 if every run succeeded."""
    signal.signal(signal.SIGTERM, _terminate)
    args = parse_args(argv)
    if args.report:  # re-render table, results.md and plot from a results.json
        return results.rerender(Path(args.report))
    missing = missing_packages()
    if missing:
        print(
            f"bench: missing {', '.join(missing)}. Install the bench extra:\n  {INSTALL_HINT}",
            file=sys.stderr,
        )
        return 2
    compile_bytecode()
    if args.in_netns is None:
        reason = network.can_shape()
        if reason is None:
            return _in_namespace(argv)
        if "shaped" in phases(args):
            print(
                f"bench: --network {args.network} needs a network namespace: {reason}",
                file=sys.stderr,
            )
            return 2
        log(f"no network namespace ({reason}): the host's loopback")
        args.host_network = True
    skip_unavailable(args)
    return run_bench(args)


def skip_unavailable(args: argparse.Namespace) -> None:
    """Drop the loaders that cannot run here, saying why and what to install."""
    for name in list(args.loaders):
        reason = unavailable(contenders.BY_NAME[name])
        if reason is not None:
            log(reason)
            args.loaders.remove(name)


def _in_namespace(argv: list[str] | None) -> int:
    """This benchmark again, inside a fresh network namespace; its exit code."""
    name = f"pfbench-{os.getpid()}"
    with network.namespace(name):
        cmd = ["ip", "netns", "exec", name, sys.executable, "-m", "bench"]
        cmd += [*(argv if argv is not None else sys.argv[1:]), "--in-netns", name]
        inner = subprocess.Popen(cmd, cwd=ROOT)
        try:
            return inner.wait()
        except KeyboardInterrupt:  # let the inner run stop its store and clean up
            inner.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                inner.wait(30)  # after that, the namespace's exit kills what is left
            return 130


def phases(args: argparse.Namespace) -> list[str]:
    return list(NETWORKS[args.network])


def run_bench(args: argparse.Namespace) -> int:
    """Start the store, upload the datasets, run every phase (or the sweep), report."""
    out = Path(args.out or ROOT / "bench-results" / time.strftime("%Y%m%d-%H%M%S"))
    out.mkdir(parents=True, exist_ok=True)
    port = S3_PORT if args.in_netns else free_port()
    if args.in_netns:
        network.unshape()
    work = Path(tempfile.mkdtemp(prefix="prefetchd-bench-"))
    ram = Path(tempfile.mkdtemp(prefix="prefetchd-bench-", dir="/dev/shm"))
    store = None
    cache_root: Path | None = None
    runs: list[dict[str, Any]] = []
    meta: dict[str, Any] = {
        "command": "python -m bench " + " ".join(args.argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": machine_info(),
        "store": args.store,
        "rate_mbit": args.rate_mbit,
        "paced_rate_mib": args.paced_rate_mib,
        "paced_first_byte_ms": args.first_byte_ms,
        "host_network": args.host_network,
        "load_at_start": os.getloadavg(),
    }
    try:
        log(f"starting {args.store} on {HOST}:{port}")
        env = bench_env(f"http://{HOST}:{port}")
        os.environ.update(env)  # the store's probe and the uploads use the same credentials
        store = start_store(args.store, port)
        chosen = layout.resolve(args.layout, args.cache_dir, ram)
        cache_root = chosen.cache_parent
        log(f"layout {chosen.describe()}")
        meta["layout"] = chosen.to_json()
        meta["repeats"] = args.repeats
        runner = Bench(
            args, store.endpoint, work, ram, env, out / "failed-runs", cache_root, chosen
        )
        uploaded = upload_all(args, store.endpoint, ram / "floor")
        meta["datasets"] = {
            n: {"objects": d.objects, "bytes": d.bytes, "records": d.records, "kind": d.spec.kind}
            for n, d in uploaded.items()
        }
        if args.sweep:
            return run_sweep(args, runner, uploaded, out, meta)
        if args.keep_sweep:
            return run_keep_sweep(args, runner, store.port, uploaded, out, meta)
        meta["networks"] = phases(args)
        for phase in phases(args):
            with phase_network(args, runner, store.port, phase) as phase_runner:
                runs += run_phase(args, phase_runner, uploaded, phase, out, meta, runs)
    except KeyboardInterrupt:
        log("interrupted: reporting the runs that finished")
        meta["interrupted"] = True
    finally:
        if store is not None:
            store.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(ram, ignore_errors=True)
        if cache_root is not None:
            shutil.rmtree(cache_root, ignore_errors=True)
    if not runs:
        return 130
    return results.report(runs, meta, out)


@contextlib.contextmanager
def phase_network(
    args: argparse.Namespace, runner: Bench, store_port: int, phase: str
) -> Iterator[Bench]:
    """The network of one phase, set up for its runs and taken down after them: the store's
    port shaped (``shaped``), the pacing proxy in front of the store (``paced``: the runs'
    endpoint is the proxy's), or plain loopback; yields the ``Bench`` the phase runs with."""
    if args.in_netns:
        network.unshape()
    if phase == "shaped":
        network.shape(store_port, args.rate_mbit)
    if phase != "paced":
        yield runner
        return
    port = PROXY_PORT if args.in_netns else free_port()
    log(f"pacing proxy on {HOST}:{port}: {args.paced_rate_mib} MiB/s per connection, "
        f"{args.first_byte_ms} ms to each first byte")  # fmt: skip
    with paced_proxy(store_port, port, args.paced_rate_mib, args.first_byte_ms, runner.env) as url:
        yield dataclasses.replace(runner, endpoint=url)


def upload_all(
    args: argparse.Namespace, endpoint: str, floor_root: Path
) -> dict[str, datasets.Uploaded]:
    """Every chosen dataset, uploaded to the store and staged on tmpfs for the floor."""
    uploaded: dict[str, datasets.Uploaded] = {}
    for spec in dataset_specs(args):
        t0 = time.monotonic()
        ds = datasets.upload_and_stage(endpoint, BUCKET, spec, args.seed, floor_root)
        uploaded[spec.name] = ds
        log(
            f"dataset {spec.name}: {ds.objects} objects, {ds.bytes / MiB:.0f} MiB, "
            f"{ds.records} records, uploaded and staged in {time.monotonic() - t0:.1f} s"
        )
    return uploaded


def dataset_specs(args: argparse.Namespace) -> list[datasets.DatasetSpec]:
    """The ``--datasets`` chosen, each with its ``--<name>-objects`` count."""
    return [
        datasets.BY_NAME[name].spec(getattr(args, datasets.option(name))) for name in args.datasets
    ]


def run_phase(
    args: argparse.Namespace,
    runner: Bench,
    uploaded: dict[str, datasets.Uploaded],
    phase: str,
    out: Path,
    meta: dict[str, Any],
    previous: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """Every planned run on one network; after each repeat, the GIL runs (``--gil-work``; not
    in the paced phase), which also time ``prefetchd status`` (bar 6) off the measured runs."""
    runs: list[dict[str, Any]] = []
    kinds = {name: ds.spec.kind for name, ds in uploaded.items()}
    every = plan_runs(list(uploaded), args.loaders, args.repeats, args.seed)
    plan = phase_plan(every, kinds, phase)
    gil_dataset = "medium" if "medium" in uploaded else next(iter(uploaded))
    for i, (repeat, name, loader) in enumerate(plan):
        runs.append(one_run(runner, uploaded[name], loader, phase, repeat))
        results.write_json(out, meta, previous + runs)
        last_of_repeat = i + 1 == len(plan) or plan[i + 1][0] != repeat
        if last_of_repeat and args.gil_work and phase != "paced":
            for gil_loader in gil_loaders(args, kinds[gil_dataset]):
                ds = uploaded[gil_dataset]
                probe = gil_loader in contenders.PREFETCHD
                runs.append(one_run(runner, ds, gil_loader, phase, repeat, args.gil_work, probe))
                results.write_json(out, meta, previous + runs)
    return runs


def phase_plan(
    plan: list[tuple[int, str, str]], kinds: Mapping[str, str], phase: str
) -> list[tuple[int, str, str]]:
    """The runs of ``plan`` that make sense in ``phase`` (pure): each contender only on the
    formats it reads, and in the paced phase only the datasets and contenders of its bar."""
    return [
        (repeat, name, loader)
        for repeat, name, loader in plan
        if contenders.BY_NAME[loader].reads(kinds[name])
        and (phase != "paced" or (name in datasets.PACED and loader in contenders.PACED))
    ]


def gil_loaders(args: argparse.Namespace, kind: str) -> list[str]:
    """The loaders measured with Python work per batch: not the ceilings (they read no
    records), only those that read the dataset's ``kind``; with ``--quick`` only those in
    ``QUICK_GIL_LOADERS``."""
    return [
        loader
        for loader in args.loaders
        if loader not in contenders.CEILINGS
        and contenders.BY_NAME[loader].reads(kind)
        and (not args.quick or loader in QUICK_GIL_LOADERS)
    ]


def run_sweep(
    args: argparse.Namespace,
    runner: Bench,
    uploaded: dict[str, datasets.Uploaded],
    out: Path,
    meta: dict[str, Any],
) -> int:
    """One knob at a time around the bench config: prefetchd (classic) on each dataset."""
    from bench.studies import sweep

    phase = "shaped" if args.in_netns and args.network != "loopback" else "loopback"
    if phase == "shaped":
        assert runner.args.in_netns
        port = int(runner.endpoint.rsplit(":", 1)[1])
        network.shape(port, args.rate_mbit)
    failed: int = sweep.sweep(args, runner, uploaded, out, meta, phase, log)
    return failed


def run_keep_sweep(
    args: argparse.Namespace,
    runner: Bench,
    store_port: int,
    uploaded: dict[str, datasets.Uploaded],
    out: Path,
    meta: dict[str, Any],
) -> int:
    """download.keep at 0, 50 % and 100 % of the first dataset, over several epochs
    (``bench/studies/keep_sweep.py``); loopback, or behind the pacing proxy with ``--network
    paced``."""
    from bench.studies import keep_sweep

    phase = "paced" if args.network == "paced" else "loopback"
    ds = uploaded[args.datasets[0]]
    with phase_network(args, runner, store_port, phase) as phase_runner:
        failed: int = keep_sweep.keep_sweep(args, phase_runner, ds, out, meta, phase, log)
    return failed


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=(bench.__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick", action="store_true", help="every dataset small, 1 repeat: < 5 minutes"
    )
    p.add_argument("--sweep", action="store_true", help="tuning curves (docs/tuning.md)")
    p.add_argument(
        "--keep-sweep",
        action="store_true",
        help="download.keep at 0/50/100 %% of the first --datasets dataset, 3 epochs each",
    )
    p.add_argument("--store", choices=STORES, default="seaweedfs")
    p.add_argument(
        "--network",
        choices=tuple(NETWORKS),
        default="bars",
        help="bars (= auto): loopback, then paced, the networks the bars are judged on; "
        "both: loopback, then shaped (root only)",
    )
    p.add_argument("--rate-mbit", type=int, default=600, help="per-connection cap when shaped")
    p.add_argument(
        "--paced-rate-mib", type=float, default=75.0, help="per-connection pace when paced"
    )
    p.add_argument(
        "--first-byte-ms", type=float, default=30.0, help="each response's first byte when paced"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help=f"default {REPEATS} (the bars take the median and the worst), --quick 1",
    )
    p.add_argument(
        "--datasets",
        default=",".join(datasets.NAMES),
        type=lambda s: [x for x in s.split(",") if x],
    )
    p.add_argument("--loaders", default=",".join(contenders.LOADERS), type=lambda s: s.split(","))
    for d in datasets.DATASETS:
        p.add_argument(
            f"--{d.name}-objects",
            type=int,
            default=None,
            help=f"{d.sizes_help} (default {d.objects})",
        )
    p.add_argument(
        "--layout",
        choices=layout.LAYOUTS,
        default="user",
        help="user (default): download.cache_dir on the local disk beside prefetchd's default, "
        "output.writers and download.concurrency as `prefetchd init` sizes them here; bench: "
        "the cache on tmpfs, 2 writers, 32 connections (the tables before issue 28)",
    )
    p.add_argument(
        "--cache-dir",
        help="parent of the private directory that holds prefetchd's download.cache_dir "
        "(default: the layout's; /dev/shm for tmpfs), removed after the run",
    )
    p.add_argument("--batch", type=int, default=32, help="records per batch")
    p.add_argument(
        "--gil-work", type=int, default=20000, help="Python loop iterations per step (0: off)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--keep-logs",
        action="store_true",
        help="daemon log at info level; every run's logs kept in <out>/logs",
    )
    p.add_argument("--out", help="results directory (default bench-results/<time>)")
    p.add_argument("--report", metavar="RESULTS_JSON", help="only re-render a run's report")
    p.add_argument("--in-netns", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    _defaults(args, argv)
    _check_names(p, args)
    return args


def _defaults(args: argparse.Namespace, argv: list[str] | None) -> None:
    """What ``--quick`` changes, and the command line as given (for the results)."""
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.host_network = False
    if "--in-netns" in args.argv:
        args.argv = args.argv[: args.argv.index("--in-netns")]
    args.repeats = args.repeats or (1 if args.quick else REPEATS)
    for d in datasets.DATASETS:
        attr = datasets.option(d.name)
        setattr(args, attr, getattr(args, attr) or (d.quick_objects if args.quick else d.objects))


def _check_names(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    bad = set(args.loaders) - set(contenders.LOADERS)
    if bad:
        p.error(f"unknown loaders {sorted(bad)}; choose from {', '.join(contenders.LOADERS)}")
    bad = set(args.datasets) - set(datasets.NAMES)
    if bad:
        p.error(f"unknown datasets {sorted(bad)}; choose from {', '.join(datasets.NAMES)}")
