"""``prefetchd init``: the config it writes loads, fits the host, and gets no size advice from
``prefetchd check`` (the same rules, prefetchd/commands/sizing.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from prefetchd.commands import sizing
from prefetchd.commands.cli import main
from prefetchd.commands.init_config import GiB, Host, MiB, plan, render
from prefetchd.config import Config, config_from_dict
from prefetchd.errors import EXIT_OK, EXIT_USAGE

HOSTS = [
    Host(cores=2, ram=8 * GiB, shm=64 * MiB, disk_free=100 * GiB),  # a container's /dev/shm
    Host(cores=2, ram=24 * GiB, shm=12 * GiB, disk_free=6 * GiB),
    Host(cores=16, ram=64 * GiB, shm=32 * GiB, disk_free=None),
    Host(cores=96, ram=1024 * GiB, shm=512 * GiB, disk_free=2000 * GiB),
]


def written(host: Host, endpoint: str | None = None) -> Config:
    text = render(plan(host), url="s3://bucket/train/", endpoint_url=endpoint)
    return config_from_dict(yaml.safe_load(text))


@pytest.mark.parametrize("host", HOSTS, ids=lambda h: f"{h.cores}cores-shm{h.shm}")
def test_the_config_loads_and_needs_no_size_advice(host: Host) -> None:
    config = written(host)
    assert sizing.advice(config, cores=host.cores, object_size=0) == []
    assert host.shm is None or config.output.ram_budget <= host.shm * 0.9
    assert config.output.ram_budget <= host.ram // 8
    if host.disk_free is not None:
        assert config.download.window <= max(GiB, host.disk_free // 2)


def test_a_gpu_host_gets_more_writers_but_keeps_most_cores() -> None:
    assert plan(HOSTS[3]).writers == 8
    assert plan(HOSTS[2]).writers == 2
    assert plan(HOSTS[0]).writers == 1


def test_an_endpoint_is_written_with_its_addressing_style() -> None:
    config = written(HOSTS[2], "http://minio.local:9000")
    assert (config.source.endpoint_url, config.source.addressing_style) == (
        "http://minio.local:9000",
        "auto",
    )


def test_cli_writes_once_and_never_overwrites(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "job.yaml"
    assert main(["init", "--url", "s3://bucket/train/", "--output", str(out)]) == EXIT_OK
    assert config_from_dict(yaml.safe_load(out.read_text())).source.url == "s3://bucket/train/"
    before = out.read_text()
    assert main(["init", "--url", "s3://other-bucket/", "--output", str(out)]) == EXIT_USAGE
    assert out.read_text() == before
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"prefetchd: --output {out}: the file exists (prefetchd init never overwrites)"


def test_cli_bad_url_is_one_line_naming_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["init", "--url", "http://bucket/"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "prefetchd: source.url: 'http://bucket/' is not allowed: expected s3://bucket/prefix/"
    ]
