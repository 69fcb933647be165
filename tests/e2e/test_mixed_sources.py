"""``sources:`` against the real daemon (moto on 127.0.0.1): three sources of three formats and
sizes mixed by weight 0.6/0.3/0.1 over two epochs.

Each record says which source, object and record it is, so the test knows every epoch's plan
(``download/mixture.py``, computed here from what was uploaded, as the daemon computes it) and
checks against it: every planned record exactly once per epoch, each source's share of the
epoch's bytes within 1 % of its weight, and every window of 1,000 records (in the order the
trainer read them) within a few % of the epoch's proportions. Then: a daemon SIGKILLed
mid-epoch and restarted (exactly once still), two hosts (disjoint and complete per source), a
weight change between epochs (``epochs.weights_by_epoch``), and ``epochs.order: replayable``
(two runs yield one sequence; a SIGKILL of the daemon or of the writer changes nothing in it).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
from array import array
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

import prefetchd
from prefetchd.config import load_config
from prefetchd.consume.position_format import job_for
from prefetchd.download.mixture import Streams, epoch_mix
from prefetchd.download.order import in_share
from prefetchd.kernel.example_decode import parse
from prefetchd.kernel.example_encode import encode_example
from prefetchd.kernel.framing import frame
from prefetchd.layout import Layout
from prefetchd.supervise.status import read_status
from testkit.trainers import finish_trainer, start_trainer
from tests.conftest import DELETE, _delete_bucket, wait_for

pytestmark = pytest.mark.e2e

RESUME_TRAINER = "tests.e2e.records_resume_trainer"
WEIGHTS = {"web": 0.6, "code": 0.3, "books": 0.1}
EPOCHS = 2
WINDOW = 1000
# A window's share of a source may differ this much from the epoch's, by output.writers
# (docs/sources.md, "Measured"): one writer draws each record's source at its rate (measured
# 0.013-0.015 alone, up to 0.032 with three such tests at once); two writers are starved
# (downloads from moto trail them: 1-6 objects open of 64 most of the time) and draw from the
# few objects that arrived (0.034-0.049 alone, 0.034-0.048 loaded). Before, the uniform draw
# across open objects measured 0.137 with one writer and 0.053-0.079 with two.
WINDOW_SLACK = {1: 0.05, 2: 0.07}


@dataclass
class Uploaded:
    """What each source holds: every object's records (their tokens) and size, by key."""

    records: dict[str, dict[str, list[bytes]]] = field(default_factory=dict)
    sizes: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, source: str, key: str, tokens: list[bytes], size: int) -> None:
        self.records.setdefault(source, {})[key] = tokens
        self.sizes.setdefault(source, {})[key] = size


def tar_object(tokens: list[bytes], rng: random.Random) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for i, token in enumerate(tokens):
            body = token + b"|" + rng.randbytes(rng.randrange(100, 400)).hex().encode()
            info = tarfile.TarInfo(f"{i:05d}.txt")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


def books_bucket(bucket: str) -> str:
    """The books are in a bucket of their own (sources may name several buckets of a store)."""
    return f"{bucket}-books"


@pytest.fixture(autouse=True)
def _books_deleted(s3_client: Any, bucket: str) -> Iterator[None]:
    """The books' bucket goes with the test's (moto's memory stays small)."""
    yield
    with contextlib.suppress(Exception):  # the test's own failure matters more
        _delete_bucket(s3_client, books_bucket(bucket))


def upload(s3: Any, bucket: str) -> Uploaded:
    """web: 80 TFRecord objects of 20-40 records; code: 300 raw objects (a record each);
    books: 20 tar objects of 10-30 samples, in ``books_bucket``. Every record's token is
    ``source:object:record``."""
    rng = random.Random(26)
    if not any(b["Name"] == books_bucket(bucket) for b in s3.list_buckets()["Buckets"]):
        s3.create_bucket(Bucket=books_bucket(bucket))
    up = Uploaded()
    for o in range(80):
        key = f"mix/web/{o:03d}.tfrecord"
        tokens = [f"web:{o}:{j}".encode() for j in range(rng.randrange(20, 40))]
        body = b"".join(
            frame(encode_example({"t": t, "pad": rng.randbytes(rng.randrange(200, 600))}))
            for t in tokens
        )
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        up.add("web", key, tokens, len(body))
    for o in range(300):
        key = f"mix/code/{o:03d}.bin"
        token = f"code:{o}:0".encode()
        body = token + b"|" + rng.randbytes(rng.randrange(500, 3000))
        s3.put_object(Bucket=bucket, Key=key, Body=body)
        up.add("code", key, [token], len(body))
    for o in range(20):
        key = f"mix/books/{o:03d}.tar"
        tokens = [f"books:{o}:{j}".encode() for j in range(rng.randrange(10, 30))]
        body = tar_object(tokens, rng)
        s3.put_object(Bucket=books_bucket(bucket), Key=key, Body=body)
        up.add("books", key, tokens, len(body))
    return up


def token_of(record: bytes) -> bytes:
    features = parse(record)
    if "t" in features:
        value = features["t"][0]
    elif "data" in features:
        value = features["data"][0]
    else:
        value = features["txt"][0]
    assert isinstance(value, bytes)
    return value.split(b"|", 1)[0]


def mixed_config(
    tmp_path: Path,
    name: str,
    write_config: Callable[..., Path],
    bucket: str,
    *,
    epochs: dict[str, Any] | None = None,
    **overrides: Any,
) -> Path:
    path = write_config(
        tmp_path / name, epochs={"count": EPOCHS, "seed": 3, **(epochs or {})}, **overrides
    )
    config = yaml.safe_load(path.read_text())
    store = config.pop("source")
    formats = {"web": "tfrecord", "code": "raw", "books": "tar"}
    buckets = {"web": bucket, "code": bucket, "books": books_bucket(bucket)}
    config["sources"] = [
        {
            **store,
            "url": f"s3://{buckets[n]}/mix/{n}/",
            "format": formats[n],
            "weight": w,
            "name": n,
        }
        for n, w in WEIGHTS.items()
    ]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def plan(up: Uploaded, config_path: Path, epoch: int) -> Counter[bytes]:
    """The records ``epoch`` must deliver on this host, from the pure plan over the upload."""
    want: Counter[bytes] = Counter()
    for (name, key), reads in planned_reads(up, config_path, epoch).items():
        want.update(up.records[name][key] * reads)
    return want


def planned_reads(up: Uploaded, config_path: Path, epoch: int) -> Counter[tuple[str, str]]:
    """How many times ``epoch`` reads each object on this host, by (source name, key)."""
    config = load_config(config_path)
    shares = []
    for src in config.sources:
        keys = sorted(
            k
            for k in up.sizes[src.name]
            if in_share(k, config.sharding.num_workers, config.sharding.worker_index)
        )
        shares.append(keys)
    streams = Streams(
        sizes=tuple(
            array("Q", [up.sizes[s.name][k] for k in keys])
            for s, keys in zip(config.sources, shares, strict=True)
        ),
        base=tuple(s.weight for s in config.sources),
        names=tuple(s.name for s in config.sources),
        schedule=config.epochs.weights_by_epoch,
        on_exhausted=config.epochs.on_exhausted,
        seed=config.epochs.seed,
    )
    mix = epoch_mix(streams, epoch)
    reads: Counter[tuple[str, str]] = Counter()
    for source, row in zip(mix.sources, mix.rows, strict=True):
        reads[(config.sources[source].name, shares[source][row])] += 1
    return reads


def read_epochs(config: Path) -> list[list[bytes]]:
    return [
        [token_of(bytes(r)) for r in prefetchd.records(config, epoch=e, timeout=120)]
        for e in range(EPOCHS)
    ]


def byte_shares(up: Uploaded, tokens: list[bytes]) -> dict[str, float]:
    """Each source's share of the bytes ``tokens`` stand for (a record: its object's bytes over
    its object's record count)."""
    per_object = {
        token: up.sizes[src][key] / len(tokens_)
        for src, objects in up.records.items()
        for key, tokens_ in objects.items()
        for token in tokens_
    }
    got = Counter[str]()
    for token in tokens:
        got[token.split(b":")[0].decode()] += per_object[token]  # type: ignore[assignment]
    total = sum(got.values())
    return {name: got[name] / total for name in WEIGHTS}


def check_windows(tokens: list[bytes]) -> float:
    """The largest difference between a source's share of records in any window of
    ``WINDOW`` consecutive records and its share in the whole epoch."""
    sources = [t.split(b":")[0] for t in tokens]
    overall = Counter(sources)
    worst = 0.0
    counts = Counter(sources[:WINDOW])
    for start in range(len(sources) - WINDOW + 1):
        if start:
            counts[sources[start - 1]] -= 1
            counts[sources[start + WINDOW - 1]] += 1
        for name, n in overall.items():
            worst = max(worst, abs(counts[name] / WINDOW - n / len(sources)))
    return worst


@pytest.mark.parametrize("writers", [1, 2])
def test_three_sources_by_weight_exactly_once_in_proportion_and_interleaved(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
    writers: int,
) -> None:
    up = upload(s3_client, bucket)
    config = mixed_config(
        tmp_path, "a", write_config, bucket, output__mix=64, output__writers=writers
    )
    daemon = run_daemon(config)
    epochs = read_epochs(config)
    assert daemon.wait(120) == 0, daemon.output()
    status = read_status(Layout.of(load_config(config)))
    assert status is not None
    assert [s.name for s in status.sources] == list(WEIGHTS)
    for src in status.sources:  # the last epoch, all downloaded: its shares as planned
        assert src.epoch_bytes_done == src.epoch_bytes > 0
        assert src.share is not None and abs(src.share - WEIGHTS[src.name]) <= 0.01
        assert src.weight == pytest.approx(WEIGHTS[src.name])
    for e, tokens in enumerate(epochs):
        assert Counter(tokens) == plan(up, config, e), f"epoch {e}: every planned record once"
        shares = byte_shares(up, tokens)
        for name, weight in WEIGHTS.items():
            assert abs(shares[name] - weight) <= 0.01, (e, shares)
        assert len(tokens) >= 3 * WINDOW
        assert check_windows(tokens) <= WINDOW_SLACK[writers], f"epoch {e}: windows"
    assert epochs[0] != epochs[1]


def test_check_checks_every_source(
    tmp_path: Path, s3_client: Any, bucket: str, write_config: Callable[..., Path]
) -> None:
    upload(s3_client, bucket)
    config = mixed_config(tmp_path, "c", write_config, bucket)
    done = prefetchd_cli("check", config)
    out = done.stdout + done.stderr
    for i, (name, fmt) in enumerate([("web", "tfrecord"), ("code", "raw"), ("books", "tar")]):
        assert f"sources[{i}].format {fmt} is available" in out, out
        assert f"readable (source {name})" in out, out


def test_a_daemon_killed_mid_epoch_delivers_every_planned_record_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The RAM budget holds a few shards, so the writers are mid-epoch, waiting for room, when
    the whole daemon is SIGKILLed; the restarted one goes on from the journals."""
    up = upload(s3_client, bucket)
    config = mixed_config(
        tmp_path, "k", write_config, bucket, output__ram_budget="2MiB", output__shard_size="256KiB"
    )
    ready = Layout.of(load_config(config)).ram_ready
    daemon = run_daemon(config)
    wait_for(lambda: ready.is_dir() and len(os.listdir(ready)) >= 3, 60, "shards before the kill")
    daemon.kill_group(signal.SIGKILL)
    daemon.wait(30)
    restarted = run_daemon(config)
    epochs = read_epochs(config)
    assert restarted.wait(120) == 0, restarted.output()
    for e, tokens in enumerate(epochs):
        assert Counter(tokens) == plan(up, config, e), f"epoch {e}: exactly once after the kill"


def test_two_hosts_each_read_their_share_of_every_source(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    up = upload(s3_client, bucket)
    configs = [
        mixed_config(
            tmp_path,
            f"h{i}",
            write_config,
            bucket,
            epochs={"count": 1},
            sharding={"num_workers": 2, "worker_index": i},
            download__client="classic",  # the other tests use crt (the default)
        )
        for i in range(2)
    ]
    daemons = [run_daemon(c) for c in configs]
    got = [[token_of(bytes(r)) for r in prefetchd.records(c, timeout=120)] for c in configs]
    for d in daemons:
        assert d.wait(120) == 0, d.output()
    for c, tokens in zip(configs, got, strict=True):
        assert Counter(tokens) == plan(up, c, 0), "each host reads its own plan, exactly once"
    objects = [{t.rsplit(b":", 1)[0] for t in tokens} for tokens in got]
    assert not objects[0] & objects[1], "the hosts' objects are disjoint"
    for name, records in up.records.items():
        everything = {t.rsplit(b":", 1)[0] for tokens in records.values() for t in tokens}
        mine = {o for o in objects[0] | objects[1] if o.startswith(name.encode() + b":")}
        # repeat: every object of every source is read at least once on one host or the other
        assert mine == everything, name


def test_weights_by_epoch_change_the_mix_from_their_epoch(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    up = upload(s3_client, bucket)
    later = {"web": 0.2, "code": 0.2, "books": 0.6}
    config = mixed_config(
        tmp_path,
        "w",
        write_config,
        bucket,
        epochs={"on_exhausted": "stop", "weights_by_epoch": [{"epoch": 1, "weights": later}]},
    )
    daemon = run_daemon(config)
    epochs = read_epochs(config)
    assert daemon.wait(120) == 0, daemon.output()
    for e, (tokens, weights) in enumerate(zip(epochs, (WEIGHTS, later), strict=True)):
        assert Counter(tokens) == plan(up, config, e), f"epoch {e}"
        assert max(Counter(tokens).values()) == 1, "stop: no record twice in an epoch"
        shares = byte_shares(up, tokens)
        for name, weight in weights.items():
            assert abs(shares[name] - weight) <= 0.01, (e, shares)


def test_two_sources_listing_the_same_keys_never_share_a_name(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Two sources over one prefix, weight 1 each: every object is read twice an epoch, once
    for each source, under two local names and two download-log lines (the hash covers the
    source): nothing is taken for already done, nothing lost."""
    up = upload(s3_client, bucket)
    path = write_config(tmp_path / "same", epochs={"count": 1, "seed": 3, "on_exhausted": "stop"})
    config = yaml.safe_load(path.read_text())
    store = config.pop("source")
    url = f"s3://{bucket}/mix/code/"
    config["sources"] = [
        {**store, "url": url, "format": "raw", "weight": 1, "name": n} for n in ("a", "b")
    ]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    daemon = run_daemon(path)
    tokens = [token_of(bytes(r)) for r in prefetchd.records(path, timeout=120)]
    assert daemon.wait(120) == 0, daemon.output()
    code = [t for tokens_ in up.records["code"].values() for t in tokens_]
    assert Counter(tokens) == Counter(code * 2), "every object once for each source"


def test_a_sigkilled_downloader_and_writer_are_restarted_and_every_record_comes_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """While a trainer reads, the downloader is SIGKILLed mid-epoch, then a writer: each is
    restarted and goes on from its log and journal; the trainer gets every planned record of
    each epoch exactly once."""
    up = upload(s3_client, bucket)
    config = mixed_config(
        tmp_path,
        "c",
        write_config,
        bucket,
        download__window="1MiB",
        download__concurrency=2,
        output__ram_budget="2MiB",
        output__shard_size="256KiB",
    )
    layout = Layout.of(load_config(config))
    daemon = run_daemon(config)
    got: list[list[bytes]] = []
    reader = threading.Thread(target=lambda: got.extend(read_epochs(config)))
    reader.start()

    def child(name: str, least: Callable[[Any], bool]) -> int:
        found: list[int] = []

        def ready() -> bool:
            status = read_status(layout)
            info = status.children.get(name) if status is not None else None
            if status is None or info is None or not info.alive or info.pid is None:
                return False
            if not least(status):
                return False
            found.append(info.pid)
            return True

        wait_for(ready, 60, f"{name} to be killed")
        return found[-1]

    os.kill(child("downloader", lambda s: s.counts.objects_downloaded >= 20), signal.SIGKILL)
    os.kill(child("writer-0", lambda s: s.counts.shards_written >= 4), signal.SIGKILL)
    reader.join(180)
    assert not reader.is_alive()
    assert daemon.wait(120) == 0, daemon.output()
    for e, tokens in enumerate(got):
        assert Counter(tokens) == plan(up, config, e), f"epoch {e}: exactly once after the kills"
    status = read_status(layout)
    assert status is not None
    assert status.children["downloader"].restarts == 1
    assert status.children["writer-0"].restarts == 1


def test_a_trainer_killed_mid_epoch_resumes_from_its_position_exactly_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """``records(position=...)`` across a SIGKILLed trainer: the position (its job covering
    every source) resumes inside the shard in progress; each epoch's plan trained once."""
    up = upload(s3_client, bucket)
    config = mixed_config(tmp_path, "p", write_config, bucket, output__shard_size="128KiB")
    daemon = run_daemon(config)
    ckpt = tmp_path / "ckpt.json"
    args = (str(ckpt), "--epochs", str(EPOCHS), "--save-every", "97", "--tokens")
    first = start_trainer(
        RESUME_TRAINER, config, tmp_path / "a.json", *args, "--crash-after", "3000"
    )
    assert first.wait(120) == -signal.SIGKILL
    saved = json.loads(ckpt.read_text())
    assert saved["position"]["records"], "the saved position is not inside a shard"
    tag = job_for(load_config(config))  # the dataset hash covers every source
    assert {k: saved["position"]["job"][k] for k in tag} == tag
    out = tmp_path / "b.json"
    second = finish_trainer(start_trainer(RESUME_TRAINER, config, out, *args, "--resume"), out)
    assert daemon.wait(120) == 0, daemon.output()
    for e in range(EPOCHS):
        got = Counter(t.encode() for epoch, t in saved["records"] + second["records"] if epoch == e)
        assert got == plan(up, config, e), f"epoch {e}: records lost or trained twice"


def prefetchd_cli(command: str, config: Path) -> subprocess.CompletedProcess[str]:
    """``prefetchd <command> --config <config>`` run to its end (bounded: 120 s)."""
    return subprocess.run(
        [sys.executable, "-m", "prefetchd", command, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


REPLAYABLE: dict[str, Any] = {
    "output__writers": DELETE,  # one writer: the replayable order's
    "output__mix": 4,
    "output__shard_size": "64KiB",
    "output__ram_budget": "1MiB",  # 16 shards: the writer waits for room, mid-epoch
}


def _with_ten_shards(config: Path, run_daemon: Callable[..., Any]) -> tuple[Any, Layout]:
    """The daemon started on ``config`` once it has published 10 shards (mid-epoch, a place to
    kill it), and its layout."""
    layout = Layout.of(load_config(config))
    daemon = run_daemon(config)
    wait_for(
        lambda: layout.ram_ready.is_dir() and len(os.listdir(layout.ram_ready)) >= 10,
        60,
        "shards before the kill",
    )
    return daemon, layout


def replayable_config(
    tmp_path: Path, name: str, write_config: Callable[..., Path], bucket: str, **overrides: Any
) -> Path:
    return mixed_config(
        tmp_path,
        name,
        write_config,
        bucket,
        epochs={"order": "replayable"},
        **{**REPLAYABLE, **overrides},
    )


def test_the_replayable_order_with_three_sources_is_the_same_on_every_run(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """``epochs.order: replayable`` on each of two hosts: two runs of a host, one of them
    downloading one object at a time (so objects arrive in another order and at another pace),
    yield the same records in the same order; each epoch its plan, exactly once."""
    up = upload(s3_client, bucket)
    runs: dict[tuple[int, int], list[list[bytes]]] = {}
    for host in (0, 1):
        for concurrency in (8, 1):
            config = replayable_config(
                tmp_path,
                f"h{host}c{concurrency}",
                write_config,
                bucket,
                sharding={"num_workers": 2, "worker_index": host},
                download__concurrency=concurrency,
            )
            daemon = run_daemon(config)
            got = runs[(host, concurrency)] = read_epochs(config)
            assert daemon.wait(120) == 0, daemon.output()
            for e, tokens in enumerate(got):
                assert Counter(tokens) == plan(up, config, e), f"host {host} epoch {e}"
    for host in (0, 1):
        assert runs[(host, 8)] == runs[(host, 1)], f"host {host}: the same seed, another order"
        assert runs[(host, 8)][0] != runs[(host, 8)][1], "both epochs in the same order"


def test_the_replayable_order_with_three_sources_survives_a_sigkill_of_the_daemon_or_writer(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The whole daemon SIGKILLed mid-epoch (the writer waiting for room, nothing read) and
    started again, then in another run the writer alone SIGKILLed mid-epoch (the supervisor
    restarts it): each yields, record by record, the sequence of a run never interrupted.
    Before the fix the daemon's restart left that sequence at the crash in 2 of 5 runs (and in
    3 of 3 with ``mix`` 4): a commit made before a one-record draw (the shard's last record did
    not fit) was followed by a step the restarted writer did not make."""
    up = upload(s3_client, bucket)
    whole = replayable_config(tmp_path, "u", write_config, bucket)
    daemon = run_daemon(whole)
    uninterrupted = read_epochs(whole)
    assert daemon.wait(120) == 0, daemon.output()
    for e, tokens in enumerate(uninterrupted):
        assert Counter(tokens) == plan(up, whole, e), f"epoch {e}"

    config = replayable_config(tmp_path, "k", write_config, bucket)
    daemon, layout = _with_ten_shards(config, run_daemon)
    daemon.kill_group(signal.SIGKILL)
    daemon.wait(30)
    restarted = run_daemon(config)
    got = read_epochs(config)
    assert restarted.wait(120) == 0, restarted.output()
    assert got == uninterrupted, "the daemon's restart changed the order"

    config = replayable_config(tmp_path, "w", write_config, bucket)
    daemon, layout = _with_ten_shards(config, run_daemon)
    status = read_status(layout)
    writer = status.children.get("writer-0") if status is not None else None
    assert writer is not None and writer.pid is not None
    os.kill(writer.pid, signal.SIGKILL)
    got = read_epochs(config)
    assert daemon.wait(120) == 0, daemon.output()
    status = read_status(layout)
    assert status is not None and status.children["writer-0"].restarts == 1
    assert got == uninterrupted, "the writer's restart changed the order"


def test_a_source_whose_bucket_is_missing_is_named_by_run_and_check(
    tmp_path: Path, s3_client: Any, bucket: str, write_config: Callable[..., Path]
) -> None:
    upload(s3_client, bucket)
    path = mixed_config(tmp_path, "g", write_config, bucket)
    config = yaml.safe_load(path.read_text())
    config["sources"][2]["url"] = f"s3://{bucket}-ghost/mix/books/"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    for command in ("run", "check"):
        done = prefetchd_cli(command, path)
        assert done.returncode == 1, done.stderr
        out = done.stdout + done.stderr
        assert f"bucket '{bucket}-ghost' does not exist (s3://{bucket}-ghost/mix/books/)" in out
        assert "Traceback" not in out


def test_a_restarted_job_continues_the_weight_schedule(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """Weights change at epoch 1; the daemon is SIGKILLed once epoch 0 is downloaded and
    started again: epoch 1 has the new weights, and each epoch its plan exactly once."""
    up = upload(s3_client, bucket)
    later = {"web": 0.2, "code": 0.2, "books": 0.6}
    config = mixed_config(
        tmp_path,
        "s",
        write_config,
        bucket,
        epochs={"weights_by_epoch": [{"epoch": 1, "weights": later}]},
        output__ram_budget="2MiB",
        output__shard_size="256KiB",
    )
    marker = Layout.of(load_config(config)).downloaded_marker(0)
    daemon = run_daemon(config)
    wait_for(marker.exists, 60, "epoch 0 downloaded")
    daemon.kill_group(signal.SIGKILL)
    daemon.wait(30)
    restarted = run_daemon(config)
    epochs = read_epochs(config)
    assert restarted.wait(120) == 0, restarted.output()
    for e, (tokens, weights) in enumerate(zip(epochs, (WEIGHTS, later), strict=True)):
        assert Counter(tokens) == plan(up, config, e), f"epoch {e}"
        shares = byte_shares(up, tokens)
        for name, weight in weights.items():
            assert abs(shares[name] - weight) <= 0.01, (e, shares)


def _host_of_job(
    tmp_path: Path, write_config: Callable[..., Path], bucket: str
) -> Callable[..., Path]:
    """``host(name, hosts, index, **sharding)``: the config of one host of a job of three
    sources, small shards (so a saved position falls inside the epoch)."""

    def host(name: str, hosts: int, index: int, count: int = EPOCHS, **resume: Any) -> Path:
        sharding = {"num_workers": hosts, "worker_index": index, **resume}
        return mixed_config(
            tmp_path,
            name,
            write_config,
            bucket,
            epochs={"count": count},
            sharding=sharding,
            output__shard_size="64KiB",
        )

    return host


def _old_hosts_killed_in_epoch(
    tmp_path: Path, old: list[Path], run_daemon: Callable[..., Any], epoch: int = 0
) -> tuple[Path, list[list[Any]]]:
    """Each old host's trainer SIGKILLed inside ``epoch``, its daemon stopped and its state
    gone: the directory of their saved positions and the records those say were trained."""
    positions = tmp_path / "positions"
    positions.mkdir()
    before: list[list[Any]] = []
    for i, config in enumerate(old):
        daemon = run_daemon(config)
        ckpt = tmp_path / f"old{i}" / "ckpt.json"
        count = load_config(config).epochs.count
        args = (str(ckpt), "--epochs", str(count), "--save-every", "7", "--tokens")
        crash = ("--crash-after", str(1500 + 400 * i), "--crash-epoch", str(epoch))
        trainer = start_trainer(RESUME_TRAINER, config, tmp_path / f"old{i}.json", *args, *crash)
        assert trainer.wait(120) == -signal.SIGKILL
        daemon.stop()
        saved = json.loads(ckpt.read_text())
        assert saved["position"]["epoch"] == epoch == saved["position"]["objects"]["epoch"]
        (positions / f"host{i}.json").write_text(json.dumps(saved["position"]))
        before += saved["records"]
        shutil.rmtree(tmp_path / f"old{i}" / "state", ignore_errors=True)  # the old host is gone
    return positions, before


def test_a_job_of_three_sources_resumed_from_two_hosts_on_three_trains_each_read_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """``sharding.resume_from`` with several sources: two hosts each train part of epoch 0 and
    are SIGKILLed; three new hosts get their positions only. Every planned read of epoch 0 (the
    old hosts' plans: books' objects are read several times in it) is trained exactly once over
    old and new hosts, and epoch 1 is each new host's own plan, split three ways. Before, a
    books object added since the old job is refused (exit 2, one line naming the old host)."""
    up = upload(s3_client, bucket)
    host = _host_of_job(tmp_path, write_config, bucket)
    old = [host(f"old{i}", 2, i) for i in range(2)]
    positions, before = _old_hosts_killed_in_epoch(tmp_path, old, run_daemon)
    resume = {"resume_from": str(positions)}

    added = "mix/books/020a.tar"  # a key the old hosts' listings did not have
    s3_client.copy_object(
        Bucket=books_bucket(bucket),
        Key=added,
        CopySource={"Bucket": books_bucket(bucket), "Key": "mix/books/000.tar"},
    )
    refused = prefetchd_cli("run", host("refused", 3, 0, **resume))
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in refused.stderr, refused.stderr
    moved = next(h for h in range(2) if in_share(added, 2, h))
    assert f"the sources changed since the old job: host {moved} of 2" in lines[0], lines[0]
    check = prefetchd_cli("check", host("refused", 3, 0, **resume))
    said = check.stdout + check.stderr
    assert check.returncode != 0 and f"changed since the old job: host {moved} of 2" in said
    s3_client.delete_object(Bucket=books_bucket(bucket), Key=added)
    check = prefetchd_cli("check", host("refused", 3, 0, **resume))
    said = check.stdout + check.stderr
    assert "the sources hold the keys the 2 old hosts' positions were saved over" in said, said

    new = [host(f"new{j}", 3, j, **resume) for j in range(3)]
    daemons = [run_daemon(config) for config in new]
    outs = [tmp_path / f"new{j}.json" for j in range(3)]
    trainers = [
        start_trainer(
            RESUME_TRAINER,
            config,
            out,
            str(tmp_path / f"new{j}" / "ckpt.json"),
            "--epochs",
            str(EPOCHS),
            "--tokens",
        )
        for j, (config, out) in enumerate(zip(new, outs, strict=True))
    ]
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    planned = plan(up, old[0], 0) + plan(up, old[1], 0)
    assert 0 < sum(1 for e, _ in before if e == 0) < sum(planned.values()) // 2
    trained = Counter(t.encode() for e, t in before + [r for h in after for r in h] if e == 0)
    assert trained == planned, "epoch 0: a planned read lost or trained twice across hosts"
    for config, records in zip(new, after, strict=True):
        got = Counter(t.encode() for e, t in records if e == 1)
        assert got and got == plan(up, config, 1), "epoch 1: each new host's own plan, once"
    status = read_status(Layout.of(load_config(new[0])))
    assert status is not None and status.job_resumed is not None
    assert status.job_resumed.startswith("resumed epoch 0 of a job of 2 hosts")


def test_a_new_host_of_three_sources_killed_in_the_resumed_epoch_resumes_it_exactly_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """2 hosts of three sources resumed on 3; then new host 0's daemon and trainer are
    SIGKILLed inside the resumed epoch and restarted: its daemon works out the same remainder
    (the same reads in the same order, so the same local names its download log knows), the
    trainer resumes from its own position, and every planned read is still trained once."""
    up = upload(s3_client, bucket)
    host = _host_of_job(tmp_path, write_config, bucket)
    old = [host(f"old{i}", 2, i) for i in range(2)]
    positions, before = _old_hosts_killed_in_epoch(tmp_path, old, run_daemon)
    new = [host(f"new{j}", 3, j, resume_from=str(positions)) for j in range(3)]
    daemons = [run_daemon(config) for config in new]
    ckpts = [tmp_path / f"new{j}" / "ckpt.json" for j in range(3)]
    args = [
        (str(ckpts[j]), "--epochs", str(EPOCHS), "--save-every", "7", "--tokens") for j in range(3)
    ]
    crashing = ("--crash-after", "300", "--crash-epoch", "0")
    killed = start_trainer(RESUME_TRAINER, new[0], tmp_path / "k.json", *args[0], *crashing)
    assert killed.wait(120) == -signal.SIGKILL
    daemons[0].kill_group(signal.SIGKILL)
    daemons[0].wait(30)
    saved = json.loads(ckpts[0].read_text())
    assert saved["position"]["epoch"] == 0 and saved["records"]
    daemons[0] = run_daemon(new[0])
    outs = [tmp_path / f"new{j}.json" for j in range(3)]
    trainers = [start_trainer(RESUME_TRAINER, new[0], outs[0], *args[0], "--resume")]
    trainers += [start_trainer(RESUME_TRAINER, new[j], outs[j], *args[j]) for j in (1, 2)]
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    every = before + saved["records"] + [r for h in after for r in h]
    planned = plan(up, old[0], 0) + plan(up, old[1], 0)
    assert Counter(t.encode() for e, t in every if e == 0) == planned, "epoch 0"
    later = sum((plan(up, config, 1) for config in new), Counter[bytes]())
    assert Counter(t.encode() for e, t in every if e == 1) == later, "epoch 1"


def test_a_job_of_three_sources_interrupted_in_epoch_1_resumes_on_three_hosts(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The interrupted epoch is not the first (each source's window starts inside its stream):
    epoch 0 was the old hosts', epoch 1 is trained once over old and new hosts, epoch 2 is each
    new host's own plan."""
    up = upload(s3_client, bucket)
    host = _host_of_job(tmp_path, write_config, bucket)
    old = [host(f"old{i}", 2, i, count=3) for i in range(2)]
    positions, before = _old_hosts_killed_in_epoch(tmp_path, old, run_daemon, epoch=1)
    new = [host(f"new{j}", 3, j, count=3, resume_from=str(positions)) for j in range(3)]
    daemons = [run_daemon(config) for config in new]
    outs = [tmp_path / f"new{j}.json" for j in range(3)]
    ckpts = [str(tmp_path / f"new{j}" / "ckpt.json") for j in range(3)]
    trainers = [
        start_trainer(RESUME_TRAINER, config, out, ckpt, "--epochs", "3", "--tokens")
        for config, out, ckpt in zip(new, outs, ckpts, strict=True)
    ]
    after = [finish_trainer(t, out)["records"] for t, out in zip(trainers, outs, strict=True)]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    every = before + [r for h in after for r in h]
    for epoch in (0, 1):
        planned = plan(up, old[0], epoch) + plan(up, old[1], epoch)
        assert Counter(t.encode() for e, t in every if e == epoch) == planned, f"epoch {epoch}"
    assert not any(e == 0 for h in after for e, _ in h), "the new hosts pass over epoch 0"
    for config, records in zip(new, after, strict=True):
        got = Counter(t.encode() for e, t in records if e == 2)
        assert got and got == plan(up, config, 2), "epoch 2: each new host's own plan, once"
