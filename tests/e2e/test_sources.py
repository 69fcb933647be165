"""End to end for every input format, GZIP shards, manifests and multi-host sharding: the real
daemon against moto, its output read by TensorFlow in trainer processes and compared with what
was uploaded."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
import zstandard

from prefetchd.errors import EXIT_INCOMPLETE
from prefetchd.messages.activity import Activity
from prefetchd.messages.child_report import ChildReport
from testkit import sample_data
from testkit.trainers import delivered

from .trainers import finish, start_consumer

pytestmark = pytest.mark.e2e

PREFIX = "data/"


def compress(data: bytes, key: str) -> bytes:
    if key.endswith(".gz"):
        return gzip.compress(data)
    if key.endswith(".zst"):
        return zstandard.ZstdCompressor(write_checksum=True).compress(data)
    return data


def put(s3: Any, bucket: str, objects: dict[str, bytes]) -> None:
    for key, body in objects.items():
        s3.put_object(Bucket=bucket, Key=key, Body=body)


def jsonl_objects(count: int, seed: int) -> tuple[dict[str, bytes], list[str]]:
    """JSONL objects, plain, .gz and .zst; every line unique. Returns (objects, lines)."""
    rng = random.Random(seed)
    objects: dict[str, bytes] = {}
    lines: list[str] = []
    for i in range(count):
        key = f"{PREFIX}logs-{i:03d}.jsonl" + ("", ".gz", ".zst")[i % 3]
        mine = [
            json.dumps({"object": i, "line": j, "text": rng.randbytes(rng.randrange(200)).hex()})
            for j in range(rng.randrange(1, 300))
        ]
        lines += mine
        objects[key] = compress(("\n".join(mine) + "\n").encode(), key)
    return objects, lines


def test_lines_from_compressed_objects_into_gzip_shards_read_by_tf_dataset(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    objects, lines = jsonl_objects(12, seed=1)
    put(s3_client, bucket, objects)
    config_path = write_config(
        tmp_path,
        source__format="lines",
        output__compression="gzip",
        output__shard_size="128KiB",
        output__ram_budget="2MiB",
    )
    daemon = run_daemon(config_path)
    out = tmp_path / "tf.json"
    result = finish(start_consumer(config_path, out, "--tf-dataset"), out)
    assert daemon.wait(120) == 0, daemon.output()
    delivered = Counter(rid for _, rid in result["records"])
    assert delivered == Counter({line: 2 for line in lines}), "2 epochs, each line twice"


def test_lines_gzip_shards_through_ready_files(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    objects, lines = jsonl_objects(6, seed=2)
    put(s3_client, bucket, objects)
    config_path = write_config(tmp_path, source__format="lines", output__compression="gzip")
    daemon = run_daemon(config_path)
    out = tmp_path / "c.json"
    result = finish(start_consumer(config_path, out), out)
    assert daemon.wait(120) == 0, daemon.output()
    assert result["shards"] and all(s.endswith(".tfrecord.gz") for s in result["shards"])
    for epoch in (0, 1):
        assert delivered([result], epoch) == Counter(lines), f"epoch {epoch}"


def webdataset_tar(first: int, count: int, rng: random.Random) -> tuple[bytes, list[str]]:
    buf = io.BytesIO()
    names = []
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(first, first + count):
            name = f"train/s{i:06d}"
            names.append(name)
            for ext, data in (
                ("jpg", rng.randbytes(rng.randrange(100, 20_000))),
                ("cls", str(i % 7).encode()),
                ("json", json.dumps({"i": i}).encode()),
            ):
                info = tarfile.TarInfo(f"{name}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), names


def test_tar_shards_one_example_per_sample_exactly_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    rng = random.Random(3)
    objects: dict[str, bytes] = {}
    samples: list[str] = []
    for i in range(8):
        key = f"{PREFIX}shard-{i:04d}.tar" + ("", ".gz")[i % 2]
        body, names = webdataset_tar(i * 40, rng.randrange(5, 40), rng)
        objects[key] = compress(body, key)
        samples += names
    put(s3_client, bucket, objects)
    config_path = write_config(tmp_path, source__format="tar")
    daemon = run_daemon(config_path)
    outs = [tmp_path / f"c{i}.json" for i in range(2)]
    procs = [start_consumer(config_path, out) for out in outs]
    results = [finish(p, out) for p, out in zip(procs, outs, strict=True)]
    assert daemon.wait(120) == 0, daemon.output()
    for epoch in (0, 1):
        assert delivered(results, epoch) == Counter(samples), f"epoch {epoch}"


def test_plugin_that_raises_quarantines_only_that_object(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    plugins = tmp_path / "plugins" / "pfd_e2e_plugin"
    plugins.mkdir(parents=True)
    (plugins / "__init__.py").write_text("")
    (plugins / "fmt.py").write_text(
        textwrap.dedent(
            """
            from prefetchd.example import encode_example

            def records(key, path):
                with open(path, "rb") as f:
                    for n, line in enumerate(f):
                        if line.startswith(b"BOOM"):
                            raise ValueError(f"cannot parse line {n}")
                        yield encode_example({"key": line.strip()})
            """
        )
    )
    good = {
        f"{PREFIX}ok-{i}.txt": b"".join(b"k%d-%d\n" % (i, j) for j in range(50)) for i in range(5)
    }
    bad_key = f"{PREFIX}bad.txt"
    put(s3_client, bucket, {**good, bad_key: b"fine\nBOOM\n"})
    config_path = write_config(
        tmp_path, source__format="pfd_e2e_plugin.fmt:records", epochs__count=1
    )
    path = os.pathsep.join(
        p for p in (str(tmp_path / "plugins"), os.environ.get("PYTHONPATH")) if p
    )
    daemon = run_daemon(config_path, env={"PYTHONPATH": path})
    out = tmp_path / "c.json"
    result = finish(start_consumer(config_path, out), out)
    assert daemon.wait(120) == 4, daemon.output()  # the object quarantined

    expected = Counter(f"k{i}-{j}" for i in range(5) for j in range(50))
    delivered = Counter(rid for _, rid in result["records"])
    assert delivered - Counter({"fine": 1}) == expected, "every healthy record, once"
    state = yaml.safe_load(Path(config_path).read_text())["status"]["state_dir"]
    status = json.loads((Path(state) / "status.json").read_text())
    assert status["errors"] >= 1
    assert any(e["key"] == bad_key and "ValueError" in e["error"] for e in status["last_errors"])
    assert bad_key in daemon.stderr.read_text(), "the quarantined key is logged"


# --- manifests --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", "s3"])
def test_manifest_reads_exactly_the_listed_keys(
    where: str,
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", [3000 + 500 * i for i in range(10)], seed=4)
    chosen = dataset["keys"][::2]  # 5 of the 10 objects
    expected: Counter[int] = Counter()
    for key in chosen:
        local = tmp_path / "obj"
        local.write_bytes(s3_client.get_object(Bucket=bucket, Key=key)["Body"].read())
        expected.update(sample_data.read_ids(local))
    lines = [
        *(f"{k}\t{dataset['sizes'][k]}" for k in chosen[:3]),  # with sizes: no request
        *chosen[3:],  # without: HEADed at start-up
        f"{PREFIX}not-there-headed.tfrecord",  # missing, found by HEAD
        f"{PREFIX}not-there-sized.tfrecord\t1234",  # missing, found by the GET (404)
        chosen[0],  # listed twice: read once
        "",
    ]
    text = "\n".join(lines) + "\n"
    if where == "local":
        manifest = tmp_path / "keys.txt"
        manifest.write_text(text)
        source = str(manifest)
    else:
        s3_client.put_object(Bucket=bucket, Key="manifests/keys.txt", Body=text.encode())
        source = f"s3://{bucket}/manifests/keys.txt"
    config_path = write_config(tmp_path, source__manifest=source, epochs__count=1)
    daemon = run_daemon(config_path)
    out = tmp_path / "c.json"
    result = finish(start_consumer(config_path, out), out)
    # the listed keys that are not there were not delivered: the job says so (exit 4)
    assert daemon.wait(120) == EXIT_INCOMPLETE, daemon.output()
    assert Counter(rid for _, rid in result["records"]) == expected
    log = daemon.stderr.read_text()
    assert "not-there-headed.tfrecord" in log and "not-there-sized.tfrecord" in log


# --- hosts --------------------------------------------------------------------------------------


def tf_config(index: int, workers: int) -> str:
    cluster = {"worker": [f"host{i}.example:2222" for i in range(workers)]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def test_three_hosts_from_tf_config_deliver_disjoint_shares_covering_every_epoch(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", [2000 + 700 * i for i in range(24)], seed=9)
    hosts = []
    for index in range(3):
        env = {"TF_CONFIG": tf_config(index, 3)}
        config_path = write_config(
            tmp_path / f"host{index}", sharding={"num_workers": "auto"}, epochs__count=2
        )
        daemon = run_daemon(config_path, env=env)
        out = tmp_path / f"host{index}.json"
        consumer = start_consumer(config_path, out, env=env)  # the host's TF_CONFIG too
        hosts.append((daemon, consumer, out))
    results = []
    for daemon, consumer, out in hosts:
        results.append(finish(consumer, out))
        assert daemon.wait(120) == 0, daemon.output()

    everything = Counter(dataset["ids"])
    for epoch in (0, 1):
        shares = [delivered([r], epoch) for r in results]
        assert all(shares), f"epoch {epoch}: a host got nothing"
        for i in range(3):
            for j in range(i + 1, 3):
                overlap = set(shares[i]) & set(shares[j])
                assert not overlap, f"epoch {epoch}: hosts {i} and {j} both got {len(overlap)}"
        assert sum(shares, Counter()) == everything, f"epoch {epoch}: not the whole dataset"


def test_plugin_that_cannot_be_imported_stops_the_daemon_naming_it(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("raw", [1000])
    config_path = write_config(tmp_path, source__format="pfd_no_such_plugin.fmt:records")
    daemon = run_daemon(config_path)
    assert daemon.wait(60) == 1, daemon.output()
    log = daemon.stderr.read_text()
    assert "source.format" in log and "pfd_no_such_plugin.fmt" in log
    assert "Traceback" not in log


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ({"source__format": "pfd_no_such_plugin.fmt:records"}, ["source.format", "pfd_no_such"]),
        ({"source__manifest": "/nonexistent/keys.txt"}, ["source.manifest", "/nonexistent"]),
        ({"source__manifest": "s3://BUCKET/no-such-manifest.txt"}, ["no-such-manifest.txt"]),
    ],
    ids=["plugin", "local-manifest", "s3-manifest"],
)
def test_check_names_a_bad_plugin_or_manifest(
    overrides: dict[str, str],
    needles: list[str],
    tmp_path: Path,
    bucket: str,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
) -> None:
    upload("raw", [1000])
    overrides = {k: v.replace("BUCKET", bucket) for k, v in overrides.items()}
    config = write_config(tmp_path, **overrides)
    proc = subprocess.run(
        [sys.executable, "-m", "prefetchd", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = [line for line in proc.stdout.splitlines() if "FAIL" in line]
    assert failed and all(n in "\n".join(failed) for n in needles), proc.stdout


def test_writer_killed_mid_object_resumes_shuffled_lines_exactly_once(
    tmp_path: Path,
    s3_client: Any,
    bucket: str,
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """The in-object shuffle (here the bounded buffer: .gz, .zst and text objects) must give the
    same order when a restarted writer reopens an object and skips the journalled count."""
    rng = random.Random(11)
    objects: dict[str, bytes] = {}
    lines: list[str] = []
    for i in range(6):
        key = f"{PREFIX}big-{i}.txt" + ("", ".gz", ".zst")[i % 3]
        mine = [f"object {i} line {j} {rng.randbytes(200).hex()}" for j in range(2500)]
        lines += mine
        objects[key] = compress(("\n".join(mine) + "\n").encode(), key)
    put(s3_client, bucket, objects)
    config_path = write_config(
        tmp_path,
        source__format="lines",
        epochs__count=1,
        output={"shard_size": "64KiB", "ram_budget": "1MiB", "compression": "gzip"},
    )
    daemon = run_daemon(config_path)
    out = tmp_path / "c.json"
    # A slow trainer and a small RAM budget: the writer blocks on the budget with objects open,
    # a state that lasts until the trainer frees a shard, so the kill lands mid-object.
    consumer = start_consumer(config_path, out, "--delay", "0.2")
    report = tmp_path / "state" / "children" / "writer-0.json"  # the writer's own counters
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        try:
            counters = ChildReport.decode(report.read_bytes())
        except (OSError, ValueError):
            counters = ChildReport()
        blocked = counters.activity is Activity.WAITING_FOR_RAM
        if counters.counts.records_written > 0 and counters.objects_open and blocked:
            victim = counters.pid
        time.sleep(0.05)
    assert victim, f"writer-0 never wrote\n{daemon.output()}"
    os.kill(victim, signal.SIGKILL)

    result = finish(consumer, out)
    assert daemon.wait(120) == 0, daemon.output()
    assert Counter(rid for _, rid in result["records"]) == Counter(lines)
    log = daemon.stderr.read_text(errors="replace")
    assert "restarting" in log
    assert "claimed objects after a restart" in log, "the kill should land mid-object"
