"""The config contract (every key: configs/example.yaml): its allowed values and one-line errors.

Every error a user can make must come back as a ``ConfigError`` (exit 2) whose message is one
line naming the key and the bad value, so ``prefetchd check`` can print it instead of a
traceback.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from prefetchd.config import (
    Config,
    config_from_dict,
    load_config,
    split_s3_url,
    workers_from_tf_config,
)
from prefetchd.errors import EXIT_USAGE, ConfigError

MiB, GiB = 1024**2, 1024**3
URL = "s3://bucket/data/"

# The full sample config: every key at its documented default, as configs/example.yaml has it.
SAMPLE_CONFIG = """\
source:
  url: s3://bucket/prefix/       # required
  endpoint_url: null             # any S3-compatible endpoint; null = AWS
  addressing_style: auto         # auto | path | virtual (MinIO, Ceph RGW often need path)
  region: null
  profile: null                  # credentials come from the standard AWS chain, never this file
  include: ["*"]                 # glob patterns matched against the key below the prefix
  format: tfrecord               # tfrecord | raw | lines | tar | "package.module:function"
  manifest: null                 # optional local file or s3:// URL listing keys, one per line
sharding:
  num_workers: 1                 # hosts in the job; "auto" reads TF_CONFIG
  worker_index: 0
epochs:
  count: 1                       # null = repeat forever
  shuffle: true
  seed: 0
  order: fast                    # fast | replayable (same seed, data, hosts => same record order)
download:
  cache_dir: /var/cache/prefetchd
  window: 16GiB                  # most bytes of raw objects on local disk at once
  keep: 0                        # most bytes of raw objects kept on local disk across epochs
  concurrency: 32                # requests in flight
  part_size: 8MiB                # ranged GET size for large objects
  client: crt                    # crt (awscrt) where installed, else classic (boto3)
  retries: 10
output:
  ram_dir: /dev/shm/prefetchd
  ram_budget: 4GiB               # most bytes of shards on the RAM disk (in progress+ready+claimed)
  writers: 2
  shard_size: 128MiB
  mix: 64                        # raw files each writer draws records from at once
  compression: none              # none | gzip
status:
  state_dir: /var/lib/prefetchd
  metrics_port: null             # Prometheus text on 127.0.0.1:PORT when set
log:
  level: info
"""


def make(**sections: dict[str, Any]) -> dict[str, Any]:
    """A config mapping with a valid source.url plus the given sections."""
    data: dict[str, Any] = {"source": {"url": URL}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return data


def one_line(err: BaseException) -> str:
    message = str(err)
    assert message.strip(), "error message is empty"
    assert "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    return message


def config_error(data: object, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, **kwargs)
    assert info.value.exit_code == EXIT_USAGE
    return one_line(info.value)


def load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = one_line(info.value)
    assert str(path) in message, "a load error names the file"
    return message


def write(tmp_path: Path, text: str, name: str = "prefetchd.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def shown(value: object) -> str:
    """How a bad value is quoted in a message: strings repr'd, everything else as JSON."""
    return repr(value) if isinstance(value, str) else json.dumps(value)


# --- the documented sample and defaults -------------------------------------------------------


def test_design_sample_config_loads_with_documented_values(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, SAMPLE_CONFIG))
    assert config.source.url == "s3://bucket/prefix/"
    assert (config.source.bucket, config.source.prefix) == ("bucket", "prefix/")
    assert config.source.include == ("*",)
    assert config.source.format == "tfrecord"
    assert config.sharding.num_workers == 1
    assert config.epochs.count == 1
    assert config.download.window == 16 * GiB
    assert config.download.part_size == 8 * MiB
    assert config.output.ram_budget == 4 * GiB
    assert config.output.shard_size == 128 * MiB
    assert config.output.compression == "none"
    assert config.status.metrics_port is None
    assert config.path == tmp_path / "prefetchd.yaml"


def test_only_source_url_is_required_and_defaults_match_design(tmp_path: Path) -> None:
    from_file = load_config(write(tmp_path, SAMPLE_CONFIG))
    minimal = config_from_dict({"source": {"url": "s3://bucket/prefix/"}})
    assert dataclasses.replace(minimal, path=from_file.path) == from_file


def test_config_round_trips_sections_given_as_null() -> None:
    config = config_from_dict({"source": {"url": URL}, "download": None, "log": None})
    assert config.download.window == 16 * GiB
    assert config.log.level == "info"


# --- every key: good values -------------------------------------------------------------------

GOOD = [
    ("source", "url", "s3://bucket", "s3://bucket"),
    ("source", "url", "s3://my.bucket-01/a/b/", "s3://my.bucket-01/a/b/"),
    ("source", "endpoint_url", "http://127.0.0.1:9000/", "http://127.0.0.1:9000"),
    ("source", "endpoint_url", "https://rgw.example.com", "https://rgw.example.com"),
    ("source", "endpoint_url", None, None),
    ("source", "region", "eu-west-1", "eu-west-1"),
    ("source", "region", None, None),
    ("source", "profile", "training", "training"),
    ("source", "profile", None, None),
    ("source", "include", "*.tfrecord", ("*.tfrecord",)),
    ("source", "include", ["train/*", "val/*.gz"], ("train/*", "val/*.gz")),
    ("source", "format", "tfrecord", "tfrecord"),
    ("source", "format", "raw", "raw"),
    ("source", "format", "my_pkg.formats:parse", "my_pkg.formats:parse"),
    ("source", "format", "plugin:records", "plugin:records"),
    ("source", "manifest", "s3://bucket/keys.txt", "s3://bucket/keys.txt"),
    ("source", "manifest", "/data/keys.txt", "/data/keys.txt"),
    ("source", "manifest", None, None),
    ("sharding", "num_workers", 4, 4),
    ("sharding", "num_workers", 100_000, 100_000),
    ("sharding", "worker_index", 0, 0),
    ("epochs", "count", None, None),
    ("epochs", "count", 10, 10),
    ("epochs", "shuffle", False, False),
    ("epochs", "order", "fast", "fast"),
    ("epochs", "order", "replayable", "replayable"),
    ("epochs", "seed", 0, 0),
    ("epochs", "seed", 2**63, 2**63),
    ("download", "cache_dir", "/data/cache", Path("/data/cache")),
    ("download", "window", "16GiB", 16 * GiB),
    ("download", "window", "512MiB", 512 * MiB),
    ("download", "window", "1.5GiB", 1536 * MiB),
    ("download", "window", "1GB", 10**9),
    ("download", "window", 4096 * 1024, 4 * MiB),
    ("download", "keep", 0, 0),
    ("download", "keep", "0", 0),
    ("download", "keep", "200GiB", 200 * GiB),
    ("download", "keep", "1.5TiB", 1536 * GiB),
    ("download", "concurrency", 1, 1),
    ("download", "concurrency", 1024, 1024),
    ("download", "part_size", "64KiB", 64 * 1024),
    ("download", "part_size", "5GiB", 5 * GiB),
    ("download", "client", "classic", "classic"),
    ("download", "client", "crt", "crt"),
    ("download", "retries", 0, 0),
    ("download", "retries", 100, 100),
    ("output", "ram_dir", "/mnt/ram/prefetchd", Path("/mnt/ram/prefetchd")),
    ("output", "ram_budget", "16GiB", 16 * GiB),
    ("output", "writers", 1, 1),
    ("output", "writers", 8, 8),
    ("output", "shard_size", "64KiB", 64 * 1024),
    ("output", "shard_size", "512MiB", 512 * MiB),
    ("output", "mix", 1, 1),
    ("output", "mix", 4096, 4096),
    ("output", "compression", "none", "none"),
    ("output", "compression", "gzip", "gzip"),
    ("status", "state_dir", "/data/state", Path("/data/state")),
    ("status", "metrics_port", 9090, 9090),
    ("status", "metrics_port", None, None),
    ("log", "level", "debug", "debug"),
    ("log", "level", "info", "info"),
    ("log", "level", "warning", "warning"),
    ("log", "level", "error", "error"),
]


@pytest.mark.parametrize(("section", "key", "value", "expected"), GOOD)
def test_every_key_accepts_its_documented_values(
    section: str, key: str, value: object, expected: object
) -> None:
    data = make(**{section: {key: value}})
    config = config_from_dict(data)
    assert getattr(getattr(config, section), key) == expected


# --- every key: bad values --------------------------------------------------------------------

BAD = [
    ("source", "url", "http://bucket/data/"),
    ("source", "url", "s3://"),
    ("source", "url", "s3://Bucket/data/"),
    ("source", "url", "bucket/data/"),
    ("source", "url", 5),
    ("source", "url", None),
    ("source", "endpoint_url", "localhost:9000"),
    ("source", "endpoint_url", "ftp://host/"),
    ("source", "endpoint_url", 9000),
    ("source", "region", ""),
    ("source", "region", "   "),
    ("source", "region", 5),
    ("source", "profile", ""),
    ("source", "profile", ["a"]),
    ("source", "include", []),
    ("source", "include", ""),
    ("source", "include", [""]),
    ("source", "include", [5]),
    ("source", "include", {"a": 1}),
    ("source", "include", 5),
    ("source", "format", "csv"),
    ("source", "format", "module_without_function"),
    ("source", "format", "mod:func:extra"),
    ("source", "format", "1mod:func"),
    ("source", "format", "my-pkg:func"),
    ("source", "format", 5),
    ("source", "format", None),
    ("source", "manifest", ""),
    ("source", "manifest", "s3://"),
    ("source", "manifest", 5),
    ("sharding", "num_workers", 0),
    ("sharding", "num_workers", -1),
    ("sharding", "num_workers", 100_001),
    ("sharding", "num_workers", "two"),
    ("sharding", "num_workers", True),
    ("sharding", "num_workers", 1.5),
    ("sharding", "num_workers", None),
    ("sharding", "worker_index", -1),
    ("sharding", "worker_index", 100_000),
    ("sharding", "worker_index", "0"),
    ("sharding", "worker_index", True),
    ("epochs", "count", 0),
    ("epochs", "count", -1),
    ("epochs", "count", "forever"),
    ("epochs", "count", True),
    ("epochs", "count", 1.5),
    ("epochs", "shuffle", "yes"),
    ("epochs", "shuffle", 1),
    ("epochs", "shuffle", None),
    ("epochs", "seed", -1),
    ("epochs", "seed", 2**63 + 1),
    ("epochs", "seed", "42"),
    ("epochs", "seed", True),
    ("epochs", "seed", 1.5),
    ("download", "cache_dir", ""),
    ("download", "cache_dir", "   "),
    ("download", "cache_dir", 5),
    ("download", "cache_dir", []),  # null is allowed: the per-user default (paths.py)
    ("download", "window", "16XB"),
    ("download", "window", -1),
    ("download", "window", True),
    ("download", "window", 1.5),
    ("download", "window", 0),
    ("download", "window", "512KiB"),
    ("download", "window", "2000TiB"),
    ("download", "window", None),
    ("download", "keep", "200XB"),
    ("download", "keep", -1),
    ("download", "keep", True),
    ("download", "keep", None),
    ("download", "keep", "2000TiB"),
    ("download", "concurrency", 0),
    ("download", "concurrency", 1025),
    ("download", "concurrency", "32"),
    ("download", "concurrency", True),
    ("download", "part_size", "32KiB"),
    ("download", "part_size", "6GiB"),
    ("download", "part_size", "8XB"),
    ("download", "client", "curl"),
    ("download", "client", 1),
    ("download", "client", None),
    ("download", "retries", -1),
    ("download", "retries", 101),
    ("download", "retries", "3"),
    ("output", "ram_dir", ""),
    ("output", "ram_dir", 5),
    ("output", "ram_budget", "16XB"),
    ("output", "ram_budget", "1KiB"),
    ("output", "ram_budget", True),
    ("output", "ram_budget", -1),
    ("output", "writers", 0),
    ("output", "writers", 65),
    ("output", "writers", "2"),
    ("output", "writers", 1.5),
    ("output", "shard_size", "1KiB"),
    ("output", "shard_size", "65GiB"),
    ("output", "shard_size", 1.5),
    ("output", "shard_size", True),
    ("output", "mix", 0),
    ("output", "mix", 4097),
    ("epochs", "order", "deterministic"),
    ("epochs", "order", "Replayable"),
    ("epochs", "order", True),
    ("epochs", "order", None),
    ("output", "compression", "zstd"),
    ("output", "compression", "gz"),
    ("output", "compression", True),
    ("output", "compression", None),
    ("status", "state_dir", ""),
    ("status", "state_dir", 3),
    ("status", "metrics_port", 0),
    ("status", "metrics_port", 65536),
    ("status", "metrics_port", "9090"),
    ("status", "metrics_port", True),
    ("log", "level", "INFO"),
    ("log", "level", "verbose"),
    ("log", "level", 3),
    ("log", "level", None),
]


@pytest.mark.parametrize(("section", "key", "value"), BAD)
def test_every_key_rejects_bad_values_naming_key_and_value(
    section: str, key: str, value: object
) -> None:
    message = config_error(make(**{section: {key: value}}))
    named = f"{section}.{key}: {shown(value)}"
    assert named in message
    reason = message.split(named, 1)[1]
    assert len(reason.split()) >= 4, "the message says what is allowed"


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("download", "window", "16XB"),
        ("output", "shard_size", "1.5"),
        ("sharding", "num_workers", "many"),
        ("log", "level", "loud"),
    ],
)
def test_bad_value_in_yaml_file_names_file_key_and_value(
    tmp_path: Path, section: str, key: str, value: str
) -> None:
    text = f"source:\n  url: {URL}\n{section}:\n  {key}: {value}\n"
    message = load_error(write(tmp_path, text))
    assert f"{section}.{key}" in message
    assert value in message


def test_a_very_long_bad_value_is_shortened_but_stays_one_line() -> None:
    message = config_error({"source": {"url": "http://" + "x" * 500}})
    assert "source.url" in message
    assert "http://xxx" in message
    assert len(message) < 400


# --- sizes through the config -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("16GiB", 16 * GiB), ("512MiB", 512 * MiB), ("1.5GiB", 1536 * MiB), ("1GB", 10**9)],
)
def test_size_strings_in_yaml(tmp_path: Path, value: str, expected: int) -> None:
    path = write(tmp_path, f"source:\n  url: {URL}\ndownload:\n  window: {value}\n")
    assert load_config(path).download.window == expected


def test_plain_byte_count_is_a_size() -> None:
    config = config_from_dict(make(output={"shard_size": 65536}))
    assert config.output.shard_size == 64 * 1024


@pytest.mark.parametrize("value", [4096, "4096", "4 KiB"])
def test_sizes_below_the_minimum_are_rejected_with_the_range(value: object) -> None:
    message = config_error(make(output={"shard_size": value}))
    assert "output.shard_size" in message
    assert "64.0 KiB" in message  # the smallest allowed value


@pytest.mark.parametrize(
    ("yaml_value", "shown_value"),
    [("16XB", "'16XB'"), ("-1", "-1"), ("true", "true"), ("1.5", "1.5")],
)
def test_bad_sizes_from_yaml(tmp_path: Path, yaml_value: str, shown_value: str) -> None:
    path = write(tmp_path, f"source:\n  url: {URL}\ndownload:\n  window: {yaml_value}\n")
    message = load_error(path)
    assert f"download.window: {shown_value}" in message


# --- unknown keys, missing keys, shapes -------------------------------------------------------


def test_unknown_top_level_key_is_named_with_the_allowed_ones() -> None:
    message = config_error({"source": {"url": URL}, "downlaod": {"window": "1GiB"}})
    assert "downlaod" in message
    assert "download" in message.split("downlaod", 1)[1], "the allowed sections are listed"


def test_unknown_key_inside_a_section_is_named_with_its_section() -> None:
    message = config_error(make(download={"windw": "1GiB"}))
    assert "download.windw" in message
    assert "download.window" in message


def test_unknown_keys_in_yaml_file(tmp_path: Path) -> None:
    text = f"source:\n  url: {URL}\n  bukcet: x\n"
    assert "source.bukcet" in load_error(write(tmp_path, text))


def test_non_string_unknown_key() -> None:
    assert "unknown key 1" in config_error({"source": {"url": URL}, 1: 2})


@pytest.mark.parametrize(
    "data",
    [{}, None, {"source": {}}, {"source": None}, {"download": {"window": "1GiB"}}],
    ids=["empty", "none", "empty-source", "null-source", "no-source"],
)
def test_missing_source_url(data: object) -> None:
    assert "source.url is required" in config_error(data)


def test_empty_yaml_file_reports_missing_source_url(tmp_path: Path) -> None:
    assert "source.url is required" in load_error(write(tmp_path, ""))


@pytest.mark.parametrize("section", ["source", "download", "output", "log"])
def test_section_that_is_not_a_mapping(section: str) -> None:
    data: dict[str, Any] = {"source": {"url": URL}, section: "16GiB"}
    message = config_error(data)
    assert section in message
    assert "'16GiB'" in message


@pytest.mark.parametrize("data", [["source"], "source", 42])
def test_top_level_that_is_not_a_mapping(data: object) -> None:
    assert "mapping" in config_error(data)


@pytest.mark.parametrize(
    "text",
    ["- source\n- download\n", "just a sentence\n", "42\n"],
    ids=["list", "string", "number"],
)
def test_yaml_that_is_not_a_mapping(tmp_path: Path, text: str) -> None:
    assert "mapping" in load_error(write(tmp_path, text))


@pytest.mark.parametrize(
    "text",
    [
        "source:\n  url: [s3://bucket/\n",
        "source:\n  url: s3://bucket/\n download: {\n",
        "source:\n\turl: s3://bucket/\n",
        'source: {url: "unterminated}\n',
    ],
    ids=["unclosed-list", "bad-indent", "tab", "unterminated-quote"],
)
def test_invalid_yaml_is_a_one_line_error_with_a_line_number(tmp_path: Path, text: str) -> None:
    message = load_error(write(tmp_path, text))
    assert "not valid YAML" in message
    assert "line" in message


def test_missing_config_file(tmp_path: Path) -> None:
    assert "not found" in load_error(tmp_path / "nope.yaml")


def test_config_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "prefetchd.yaml"
    path.write_bytes(b"source:\n  url: s3://bucket/\xff\xfe\n")
    assert "cannot read" in load_error(path)


# --- duplicate keys ---------------------------------------------------------------------------


def test_duplicate_top_level_key_is_an_error_not_last_one_wins(tmp_path: Path) -> None:
    text = f"source:\n  url: {URL}\nsource:\n  url: s3://other/\n"
    message = load_error(write(tmp_path, text))
    assert "duplicate key source at line" in message
    assert "line 3" in message


def test_duplicate_nested_key_is_an_error(tmp_path: Path) -> None:
    text = f"source:\n  url: {URL}\ndownload:\n  window: 1GiB\n  window: 2GiB\n"
    message = load_error(write(tmp_path, text))
    assert "duplicate key download.window at line 5" in message
    assert "line 5" in message


def test_same_key_in_different_sections_is_not_a_duplicate(tmp_path: Path) -> None:
    # "count"-like names may repeat across sections; only repeats within one mapping are errors
    text = f"source:\n  url: {URL}\ndownload:\n  retries: 3\nepochs:\n  count: 3\n"
    config = load_config(write(tmp_path, text))
    assert (config.download.retries, config.epochs.count) == (3, 3)


def test_unhashable_yaml_key_is_a_config_error_not_a_traceback(tmp_path: Path) -> None:
    # regression: the duplicate-key check raised TypeError on a complex (list) key
    text = f"source:\n  url: {URL}\n? [a, b]\n: 1\n"
    load_error(write(tmp_path, text))


# --- sharding and TF_CONFIG -------------------------------------------------------------------


@pytest.mark.parametrize(("num", "index"), [(1, 1), (2, 2), (3, 7)])
def test_worker_index_must_be_below_num_workers(num: int, index: int) -> None:
    message = config_error(make(sharding={"num_workers": num, "worker_index": index}))
    assert f"sharding.worker_index: {index}" in message
    assert f"sharding.num_workers is {num}" in message


def test_worker_index_without_num_workers_is_checked_against_the_default() -> None:
    assert "sharding.worker_index: 1" in config_error(make(sharding={"worker_index": 1}))


def test_last_worker_index_is_allowed() -> None:
    config = config_from_dict(make(sharding={"num_workers": 3, "worker_index": 2}))
    assert (config.sharding.num_workers, config.sharding.worker_index) == (3, 2)


def tf_config(task_type: str, index: object, *, chief: int = 1, workers: int = 2) -> str:
    cluster: dict[str, list[str]] = {"worker": [f"w{i}:2222" for i in range(workers)]}
    if chief:
        cluster["chief"] = [f"c{i}:2222" for i in range(chief)]
    cluster["ps"] = ["ps0:2222"]
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


@pytest.mark.parametrize(
    ("task_type", "index", "expected"),
    [("chief", 0, (3, 0)), ("worker", 0, (3, 1)), ("worker", 1, (3, 2))],
)
def test_tf_config_with_chief_numbers_chief_first(
    task_type: str, index: int, expected: tuple[int, int]
) -> None:
    assert workers_from_tf_config(tf_config(task_type, index)) == expected


@pytest.mark.parametrize("index", [0, 1, 2])
def test_tf_config_without_chief_uses_worker_index(index: int) -> None:
    spec = tf_config("worker", index, chief=0, workers=3)
    assert workers_from_tf_config(spec) == (3, index)


def test_tf_config_hosts_cover_every_index_exactly_once() -> None:
    tasks = [("chief", 0)] + [("worker", i) for i in range(4)]
    results = [workers_from_tf_config(tf_config(t, i, workers=4)) for t, i in tasks]
    assert {n for n, _ in results} == {5}
    assert sorted(i for _, i in results) == [0, 1, 2, 3, 4]


def test_tf_config_index_given_as_string() -> None:
    assert workers_from_tf_config(tf_config("worker", "1")) == (3, 2)


@pytest.mark.parametrize("text", [None, ""])
def test_tf_config_missing(text: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        workers_from_tf_config(text)
    message = one_line(info.value)
    assert "sharding.num_workers" in message
    assert "TF_CONFIG is not set" in message


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '"worker"',
        "{}",
        '{"cluster": {"worker": ["w0"]}}',
        '{"task": {"type": "worker", "index": 0}}',
        '{"cluster": ["w0"], "task": {"type": "worker", "index": 0}}',
        '{"cluster": {"worker": ["w0"]}, "task": {"type": "worker"}}',
        '{"cluster": {"worker": ["w0"]}, "task": {"type": "worker", "index": "first"}}',
        '{"cluster": {"worker": ["w0"]}, "task": "worker:0"}',
    ],
)
def test_tf_config_invalid(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        workers_from_tf_config(text)
    message = one_line(info.value)
    assert "sharding.num_workers" in message
    assert "TF_CONFIG" in message


@pytest.mark.parametrize(
    ("task_type", "index"),
    [("ps", 0), ("evaluator", 0), ("worker", 2), ("worker", -1), ("chief", 1)],
)
def test_tf_config_task_outside_the_training_cluster(task_type: str, index: int) -> None:
    with pytest.raises(ConfigError) as info:
        workers_from_tf_config(tf_config(task_type, index))
    message = one_line(info.value)
    assert "TF_CONFIG" in message
    assert f"{task_type}:{index}" in message


def test_num_workers_auto_reads_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 1))
    config = config_from_dict(make(sharding={"num_workers": "auto"}))
    assert (config.sharding.num_workers, config.sharding.worker_index) == (3, 2)


def test_num_workers_auto_from_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config("chief", 0))
    text = f"source:\n  url: {URL}\nsharding:\n  num_workers: auto\n"
    config = load_config(write(tmp_path, text))
    assert (config.sharding.num_workers, config.sharding.worker_index) == (3, 0)


def test_num_workers_auto_without_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    message = config_error(make(sharding={"num_workers": "auto"}))
    assert "TF_CONFIG is not set" in message


def test_num_workers_auto_with_invalid_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", "{not json")
    message = config_error(make(sharding={"num_workers": "auto"}))
    assert "TF_CONFIG" in message


def test_num_workers_auto_forbids_worker_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", tf_config("worker", 0))
    message = config_error(make(sharding={"num_workers": "auto", "worker_index": 0}))
    assert "sharding.worker_index" in message
    assert "auto" in message


# --- cross-field checks -----------------------------------------------------------------------


def test_ram_budget_must_hold_a_shard_per_writer_plus_one() -> None:
    data = make(output={"ram_budget": "256MiB", "writers": 2, "shard_size": "128MiB"})
    message = config_error(data)
    assert "output.ram_budget" in message
    assert "256.0 MiB" in message
    assert "384.0 MiB" in message  # (2 + 1) x 128 MiB
    assert "output.writers" in message
    assert "output.shard_size" in message


def test_ram_budget_exactly_writers_plus_one_shards_is_enough() -> None:
    data = make(output={"ram_budget": "384MiB", "writers": 2, "shard_size": "128MiB"})
    assert config_from_dict(data).output.ram_budget == 384 * MiB


def test_many_writers_need_a_bigger_budget_than_the_default() -> None:
    assert "output.ram_budget" in config_error(make(output={"writers": 64}))


@pytest.mark.parametrize(
    ("dirs", "named"),
    [
        (
            {"download": {"cache_dir": "/data/x"}, "output": {"ram_dir": "/data/x"}},
            ("download.cache_dir", "output.ram_dir"),
        ),
        (
            {"download": {"cache_dir": "/data/x"}, "output": {"ram_dir": "/data/y/../x/"}},
            ("download.cache_dir", "output.ram_dir"),
        ),
        (
            {"download": {"cache_dir": "/data/cache"}, "status": {"state_dir": "/data/cache/st"}},
            ("download.cache_dir", "status.state_dir"),
        ),
        (
            {"output": {"ram_dir": "/data"}, "download": {"cache_dir": "/data/a/b/cache"}},
            ("download.cache_dir", "output.ram_dir"),
        ),
        (
            {"output": {"ram_dir": "/srv/ram/state"}, "status": {"state_dir": "/srv/ram"}},
            ("output.ram_dir", "status.state_dir"),
        ),
    ],
    ids=["equal", "equal-after-normalising", "state-in-cache", "cache-in-ram", "ram-in-state"],
)
def test_directories_must_be_separate(
    dirs: dict[str, dict[str, Any]], named: tuple[str, str]
) -> None:
    message = config_error(make(**dirs))
    for key in named:
        assert key in message


def test_sibling_directories_sharing_a_name_prefix_are_fine() -> None:
    data = make(
        download={"cache_dir": "/data/cache"},
        output={"ram_dir": "/data/cache2"},
        status={"state_dir": "/data/cache-state"},
    )
    assert config_from_dict(data).output.ram_dir == Path("/data/cache2")


def test_relative_and_absolute_spelling_of_the_same_directory_clash(tmp_path: Path) -> None:
    data = make(download={"cache_dir": "x"}, output={"ram_dir": str(tmp_path / "x")})
    message = config_error(data, base_dir=tmp_path)
    assert "download.cache_dir" in message
    assert "output.ram_dir" in message


# --- paths ------------------------------------------------------------------------------------


def test_relative_paths_are_resolved_against_the_config_files_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf_dir = tmp_path / "conf"
    conf_dir.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = (
        f"source:\n  url: {URL}\n"
        "download:\n  cache_dir: cache\n"
        "output:\n  ram_dir: ./ram\n"
        "status:\n  state_dir: ../state\n"
    )
    config = load_config(write(conf_dir, text))
    base = conf_dir.resolve()
    assert config.download.cache_dir == base / "cache"
    assert config.output.ram_dir.resolve() == base / "ram"
    assert config.status.state_dir.resolve() == base.parent / "state"
    for path in (config.download.cache_dir, config.output.ram_dir, config.status.state_dir):
        assert path.is_absolute()


def test_config_loaded_through_a_relative_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "conf").mkdir()
    write(tmp_path / "conf", f"source:\n  url: {URL}\ndownload:\n  cache_dir: cache\n")
    monkeypatch.chdir(tmp_path)
    config = load_config("conf/prefetchd.yaml")
    assert config.download.cache_dir == (tmp_path / "conf").resolve() / "cache"


def test_home_directory_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = config_from_dict(make(download={"cache_dir": "~/cache"}))
    assert config.download.cache_dir == tmp_path / "home" / "cache"


def test_relative_paths_without_a_file_use_base_dir_or_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make(download={"cache_dir": "cache"})
    assert config_from_dict(data, base_dir=tmp_path).download.cache_dir == tmp_path / "cache"
    monkeypatch.chdir(tmp_path)
    assert config_from_dict(data).download.cache_dir == Path.cwd() / "cache"


# --- the config object ------------------------------------------------------------------------


def test_config_is_frozen() -> None:
    config = config_from_dict(make())
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.source = config.source  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.download.window = 1  # type: ignore[misc]
    for section in ("source", "sharding", "epochs", "download", "output", "status", "log"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            getattr(config, section).url = "s3://other/"
    assert isinstance(config.source.include, tuple), "no mutable list inside a frozen config"


def test_config_is_hashable_and_comparable() -> None:
    a, b = config_from_dict(make()), config_from_dict(make())
    assert a == b
    assert hash(a) == hash(b)
    assert isinstance(a, Config)


def test_job_fingerprint_is_json_and_changes_with_the_data_source() -> None:
    base = config_from_dict(make())
    other = config_from_dict(make(epochs={"seed": 7}))
    json.dumps(base.job_fingerprint())
    assert base.job_fingerprint() != other.job_fingerprint()
    tuned = config_from_dict(make(download={"concurrency": 8}))
    assert base.job_fingerprint() == tuned.job_fingerprint(), "tuning knobs are not the job"


# --- split_s3_url -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", ("bucket", "")),
        ("s3://bucket/", ("bucket", "")),
        ("s3://bucket/data/train/", ("bucket", "data/train/")),
        ("s3://my.bucket-01/a", ("my.bucket-01", "a")),
    ],
)
def test_split_s3_url(url: str, expected: tuple[str, str]) -> None:
    assert split_s3_url(url) == expected


@pytest.mark.parametrize(
    "url", ["", "bucket/prefix", "S3://bucket/", "s3:/bucket", "s3:///prefix", "s3://Bucket/"]
)
def test_split_s3_url_rejects(url: str) -> None:
    with pytest.raises(ValueError, match="s3://bucket/prefix/"):
        split_s3_url(url)


def test_a_replayable_order_is_written_by_one_writer() -> None:
    """``epochs.order: replayable`` takes one writer unless the config names another number,
    which is refused in one line naming both keys."""
    assert config_from_dict(make(epochs={"order": "replayable"})).output.writers == 1
    assert config_from_dict(make(epochs={"order": "fast"})).output.writers == 2
    message = config_error(make(epochs={"order": "replayable"}, output={"writers": 2}))
    assert "output.writers: 2" in message and "epochs.order: replayable" in message
    assert "\n" not in message
    one = make(epochs={"order": "replayable"}, output={"writers": 1})
    assert config_from_dict(one).output.writers == 1


def test_request_and_byte_budgets_default_to_none_and_take_rates_and_sizes() -> None:
    default = config_from_dict(make())
    assert default.download.max_requests_per_s is None
    assert default.download.max_bytes_per_s is None
    set_ = config_from_dict(make(download={"max_requests_per_s": 250, "max_bytes_per_s": "200MiB"}))
    assert set_.download.max_requests_per_s == 250.0
    assert set_.download.max_bytes_per_s == 200 * 2**20


@pytest.mark.parametrize(
    ("key", "value", "allowed"),
    [
        ("max_requests_per_s", 0, "requests per second from 0.1 to"),
        ("max_requests_per_s", "fast", "requests per second from 0.1 to"),
        ("max_requests_per_s", True, "requests per second from 0.1 to"),
        ("max_bytes_per_s", "1KiB", "a size from 64.0 KiB"),
        ("max_bytes_per_s", "lots", ""),
    ],
)
def test_bad_budgets_are_one_line_naming_the_key(key: str, value: object, allowed: str) -> None:
    message = config_error(make(download={key: value}))
    assert message.startswith(f"download.{key}: ") and allowed in message


# --- several sources (sources:, docs/sources.md) ----------------------------------------------


def _mixed(**extra: Any) -> dict[str, Any]:
    return {
        "sources": [
            {"url": "s3://bucket/web/", "weight": 0.6, "name": "web"},
            {"url": "s3://bucket/code/", "weight": 0.3, "format": "raw"},
        ],
        **extra,
    }


def test_resume_from_is_allowed_with_several_sources_that_repeat() -> None:
    config = config_from_dict(_mixed(sharding={"resume_from": "/tmp/old-positions"}))
    assert config.mixed and config.sharding.resume_from is not None


def test_sources_are_a_list_with_weights_and_names_defaulting_to_their_index() -> None:
    config = config_from_dict(_mixed())
    assert config.mixed
    assert [s.name for s in config.sources] == ["web", "s1"]
    assert [s.weight for s in config.sources] == [0.6, 0.3]
    assert config.source is config.sources[0]
    assert config.sources[1].format == "raw"
    assert config.epochs.on_exhausted == "repeat"
    single = config_from_dict({"source": {"url": URL}})
    assert not single.mixed and single.sources == (single.source,)
    assert single.source.weight == 1.0


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**_mixed(), "source": {"url": URL}}, "source and sources are both set"),
        ({"sources": []}, r"sources: \[\] is not allowed"),
        (
            {"sources": [{"url": URL}, {"url": URL, "weight": 1}]},
            r"sources\[0\]\.weight is required",
        ),
        ({"sources": [{"url": URL, "weight": 0}]}, r"sources\[0\]\.weight: 0 is not allowed"),
        ({"sources": [{"url": URL, "weight": True}]}, r"sources\[0\]\.weight"),
        (
            {
                "sources": [
                    {"url": URL, "weight": 1, "name": "a"},
                    {"url": URL, "weight": 1, "name": "a"},
                ]
            },
            r"sources\[1\]\.name: 'a' is not allowed: names must be unique",
        ),
        ({"sources": [{"url": URL, "weight": 1, "name": "a/b"}]}, r"sources\[0\]\.name"),
        (
            {"sources": [{"url": URL, "weight": 1, "colour": 1}]},
            r"unknown key sources\[0\]\.colour",
        ),
        (
            {
                "sources": [
                    {"url": URL, "weight": 1},
                    {"url": "s3://other/x/", "weight": 1, "region": "eu-west-1"},
                ]
            },
            r"sources\[1\]\.region: every source must be in the store of sources\[0\]",
        ),
        (
            _mixed(sharding={"resume_from": "/tmp/old"}, epochs={"on_exhausted": "stop"}),
            "sharding.resume_from is not allowed with several sources and epochs.on_exhausted "
            "'stop' yet",
        ),
        (_mixed(epochs={"on_exhausted": "wrap"}), "epochs.on_exhausted: 'wrap' is not allowed"),
        (
            _mixed(epochs={"weights_by_epoch": [{"epoch": 1, "weights": {"web": 1}}]}),
            r"epochs.weights_by_epoch\[0\]\.weights: names \['web'\] are not allowed",
        ),
        (
            _mixed(epochs={"weights_by_epoch": [{"epoch": 1}]}),
            "epochs.weights_by_epoch: .* expected a list of",
        ),
        (
            {
                "source": {"url": URL},
                "epochs": {"weights_by_epoch": [{"epoch": 1, "weights": {"s0": 1}}]},
            },
            "epochs.weights_by_epoch needs sources: with more than one source",
        ),
    ],
)
def test_a_bad_sources_list_is_one_line_naming_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        config_from_dict(data)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == EXIT_USAGE


def test_download_keep_takes_several_sources() -> None:
    config = config_from_dict(_mixed(download={"keep": "1GiB"}))
    assert config.mixed and config.download.keep == 1024**3


def test_the_replayable_order_takes_several_sources_with_one_writer() -> None:
    config = config_from_dict(_mixed(epochs={"order": "replayable"}))
    assert config.mixed and config.output.writers == 1


def test_sources_may_name_several_buckets_of_one_store() -> None:
    config = config_from_dict(
        {"sources": [{"url": URL, "weight": 1}, {"url": "s3://other/x/", "weight": 1}]}
    )
    assert [s.bucket for s in config.sources] == ["bucket", "other"]


def test_weights_by_epoch_and_the_job_fingerprint_cover_every_source() -> None:
    schedule = [{"epoch": 2, "weights": {"web": 1, "s1": 3}}]
    config = config_from_dict(_mixed(epochs={"weights_by_epoch": schedule, "on_exhausted": "stop"}))
    assert config.epochs.weights_by_epoch == ((2, (("s1", 3.0), ("web", 1.0))),)
    other = config_from_dict(_mixed())
    assert config.job_fingerprint() != other.job_fingerprint()
    reweighted = _mixed()
    reweighted["sources"][1]["weight"] = 0.4
    assert config_from_dict(reweighted).job_fingerprint() != other.job_fingerprint()
