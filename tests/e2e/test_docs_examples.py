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

from .test_tensorflow import SMALL, free_ports, tf_config

pytestmark = pytest.mark.e2e


def example(page: str, tmp_path: Path) -> Path:
    """The first python block under the page's "## Example" heading, as a script file."""
    text = (ROOT / "docs" / page).read_text()
    section = text.split("\n## Example\n", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, f"{page} has no example"
    # train_*.py: a script named tensorflow.py or keras.py would shadow the package
    script = tmp_path / ("train_" + page.replace(".md", ".py").replace("-", "_"))
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
