"""The examples of docs/tensorflow.md, docs/keras.md and docs/multi-worker.md run as written,
against the real daemon, and consume every epoch (the daemon exits 0 only then)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testkit.trainers import ROOT
from tests.conftest import wait_for

from .test_tensorflow import SMALL, free_ports, tf_config

pytestmark = pytest.mark.e2e


def example(page: str, tmp_path: Path, heading: str = "Example") -> Path:
    """The first python block under the page's ``## <heading>`` (``heading`` may start with
    its own ``#``s, e.g. ``### Resuming``), as a script file."""
    text = (ROOT / "docs" / page).read_text()
    line = heading if heading.startswith("#") else f"## {heading}"
    section = text.split(f"\n{line}\n", 1)[1]
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

    def second_checkpoint() -> bool:
        for proc in first:
            if proc.poll() is not None:
                pytest.fail(f"a worker ended before the kill:\n{proc.communicate()[0][-3000:]}")
        return all((checkpoints / f"worker{i}" / "ckpt-2.index").exists() for i in range(2))

    wait_for(second_checkpoint, 120, "the workers' second checkpoint")
    for proc in first:
        proc.kill()
        proc.communicate()
    outputs = [finish(proc) for proc in start()]
    for daemon in daemons:
        assert daemon.wait(120) == 0, daemon.output()
    assert all(re.search(r"trained \d+ steps", out) for out in outputs), outputs


def test_the_plain_python_resume_recipe_runs_as_written_after_a_kill(
    tmp_path: Path,
    upload: Callable[..., Any],
    write_config: Callable[..., Path],
    run_daemon: Callable[..., Any],
) -> None:
    """docs/plain-python.md's ``records(config, position=...)`` recipe, as written: killed
    (SIGKILL) after its first checkpoint, then started again with the same command, it finishes
    and the daemon sees every epoch consumed (``tests/e2e/test_records.py`` and
    ``tests/functional/test_records.py`` check the resume record by record)."""
    upload("tfrecord", SMALL * 6, seed=23)  # ~2,700 records: past the recipe's first save
    script = example("plain-python.md", tmp_path, "### Resuming: `position`, to the record")
    config = write_config(tmp_path / "host", epochs__count=2, output__shard_size="64KiB")
    daemon = run_daemon(config)
    work = tmp_path / "work"  # the recipe writes checkpoint.json where it runs
    work.mkdir()

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(script), str(config)],
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    first = start()
    checkpoint = work / "checkpoint.json"

    def checkpointed() -> bool:
        if first.poll() is not None:
            pytest.fail(f"the recipe ended before the kill:\n{first.communicate()[0][-3000:]}")
        return checkpoint.exists()

    wait_for(checkpointed, 120, "the recipe's first checkpoint", interval=0.05)
    first.kill()
    first.communicate()
    saved = json.loads(checkpoint.read_text())
    assert saved["step"] >= 1000 and saved["position"]["version"] == 2
    finish(start())
    assert daemon.wait(120) == 0, daemon.output()
