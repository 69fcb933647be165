"""The examples of docs/tensorflow.md, docs/keras.md and docs/multi-worker.md run as written,
against the real daemon, and consume every epoch (the daemon exits 0 only then)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import ROOT

from .test_tensorflow import SMALL, free_ports, tf_config

pytestmark = pytest.mark.e2e


def example(page: str, tmp_path: Path, heading: str = "Example") -> Path:
    """The first python block under the page's ``## <heading>``, as a script file."""
    text = (ROOT / "docs" / page).read_text()
    section = text.split(f"\n## {heading}\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, f"{page} has no python block under {heading!r}"
    # train_*.py: a script named tensorflow.py or keras.py would shadow the package
    name = page.replace(".md", "") + ("" if heading == "Example" else "_resume")
    script = tmp_path / f"train_{name.replace('-', '_')}.py"
    script.write_text(code.group(1))
    return script


def run(script: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**__import__("os").environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})},
    )


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the example still ran after {timeout:.0f} s:\n{out[-3000:]}")
    assert proc.returncode == 0, f"the example failed:\n{out[-3000:]}"
    return out


@pytest.mark.parametrize("page", ["tensorflow.md", "keras.md"])
def test_a_single_worker_example_trains_every_epoch(
    page: str,
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    upload("tfrecord", SMALL, seed=13)
    config = write_config(tmp_path / "host", epochs__count=3, output__shard_size="64KiB")
    daemon = run_daemon(config)
    finish(run(example(page, tmp_path), str(config), str(tmp_path / "ckpt")))
    assert daemon.wait(120) == 0, daemon.output()


def test_the_multi_worker_example_trains_every_record_once(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    dataset = upload("tfrecord", SMALL * 2, seed=17)
    script = example("multi-worker.md", tmp_path)
    ports = free_ports(2)
    procs, daemons = [], []
    for index in range(2):
        config = write_config(
            tmp_path / f"host{index}",
            epochs__count=2,
            output__shard_size="64KiB",
            sharding={"num_workers": "auto"},
        )
        env = {"TF_CONFIG": tf_config(ports, index)}
        daemons.append(run_daemon(config, env=env))
        procs.append(run(script, str(config), env=env))
    outputs = [finish(proc) for proc in procs]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    for out in outputs:
        totals = re.findall(r"epoch (\d): (\d+) records trained over all workers", out)
        assert totals == [("0", str(len(dataset["ids"]))), ("1", str(len(dataset["ids"])))], (
            json.dumps(out[-2000:])
        )


def test_the_multi_worker_resume_recipe_runs_as_written_after_every_worker_was_killed(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """docs/multi-worker.md's resume recipe: both workers killed once each saved twice, then
    started again with the same command, finish, and each daemon sees every epoch consumed
    (tests/e2e/test_tensorflow.py checks the same recipe record by record)."""
    upload("tfrecord", SMALL * 2, seed=19)
    script = example("multi-worker.md", tmp_path, "Resume after every worker was killed")
    ports = free_ports(2)
    checkpoints = tmp_path / "ckpt"
    configs, daemons = [], []
    for index in range(2):
        config = write_config(
            tmp_path / f"host{index}",
            epochs__count=2,
            output__shard_size="64KiB",
            sharding={"num_workers": "auto"},
        )
        configs.append(config)
        daemons.append(run_daemon(config, env={"TF_CONFIG": tf_config(ports, index)}))

    def start() -> list[subprocess.Popen[str]]:
        return [
            run(script, str(config), str(checkpoints), env={"TF_CONFIG": tf_config(ports, i)})
            for i, config in enumerate(configs)
        ]

    first = start()
    deadline = time.monotonic() + 120
    while not all((checkpoints / f"worker{i}" / "ckpt-2.index").exists() for i in range(2)):
        assert time.monotonic() < deadline, "the workers saved no second checkpoint in 120 s"
        for proc in first:
            if proc.poll() is not None:
                pytest.fail(f"a worker ended before the kill:\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.1)
    for proc in first:
        proc.kill()
        proc.communicate()
    outputs = [finish(proc) for proc in start()]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    assert all(re.search(r"trained \d+ steps", out) for out in outputs), outputs
