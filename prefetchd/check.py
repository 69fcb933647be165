"""``prefetchd check``: is this config going to work? Validates without starting anything."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import botocore.exceptions

from prefetchd.config import Config, split_s3_url
from prefetchd.download.order import in_share, matches
from prefetchd.download.store import S3Client, boot_failure, describe, make_client
from prefetchd.errors import ConfigError
from prefetchd.layout import Layout
from prefetchd.owner import dir_findings
from prefetchd.sizes import format_size
from prefetchd.write.formats import get_format


@dataclass(frozen=True)
class Finding:
    level: str  # "ok" | "warn" | "fail"
    message: str


def run_checks(config: Config) -> list[Finding]:
    findings = [Finding("ok", f"config {config.path or '(object)'} is valid")]
    findings.append(_check_format(config))
    findings.append(_check_writer_core())
    findings += list(_check_store(config))
    findings.append(_check_ram_dir(config))
    findings.append(
        _check_dir("download.cache_dir", config.download.cache_dir, config.download.window)
    )
    findings.append(_check_dir("status.state_dir", config.status.state_dir, 0))
    # What the daemon would refuse at start-up (unsafe, foreign, or owned by another running
    # daemon), said now; changes nothing.
    findings += [Finding(level, message) for level, message in dir_findings(Layout.of(config))]
    return findings


def _check_store(config: Config) -> Iterator[Finding]:
    session = boto3.session.Session(
        profile_name=config.source.profile, region_name=config.source.region
    )
    if session.get_credentials() is None:
        yield Finding("fail", "no AWS credentials found (environment, profile or instance role)")
        return
    yield Finding("ok", "credentials found")
    client = make_client(config, pool=2)
    src = config.source
    try:
        client.head_bucket(Bucket=src.bucket)
        page = client.list_objects_v2(Bucket=src.bucket, Prefix=src.prefix, MaxKeys=1000)
    except Exception as exc:
        yield Finding("fail", str(boot_failure(config, exc)))
        return
    keys = [item["Key"] for item in page.get("Contents", [])]
    shard = config.sharding
    matching = [
        k
        for k in keys
        if matches(k[len(src.prefix) :], src.include)
        and in_share(k, shard.num_workers, shard.worker_index)
    ]
    more = " (first page)" if page.get("IsTruncated") else ""
    if src.manifest:
        yield _check_manifest(client, src.manifest)
    if not matching and not src.manifest:
        yield Finding(
            "fail", f"no objects under {src.url} match source.include for this worker{more}"
        )
    else:
        yield Finding(
            "ok",
            f"bucket {src.bucket} readable: {len(matching)} of {len(keys)} listed objects "
            f"are this worker's{more}",
        )


def _check_format(config: Config) -> Finding:
    """A plugin format is imported here as the writers will import it."""
    try:
        get_format(config.source.format)
    except ConfigError as exc:
        return Finding("fail", str(exc))
    return Finding("ok", f"source.format {config.source.format} is available")


def _check_writer_core() -> Finding:
    """Which core frames records: the C core, or its slower pure-Python twin (same bytes)."""
    from prefetchd.write import core, pycore

    level = "ok" if core.IMPL is not pycore else "warn"
    return Finding(level, f"writers frame records in {core.ACTIVE}")


def _check_manifest(client: S3Client, manifest: str) -> Finding:
    if manifest.startswith("s3://"):
        bucket, key = split_s3_url(manifest)
        try:
            client.head_object(Bucket=bucket, Key=key)
        except botocore.exceptions.ClientError as exc:
            return Finding("fail", f"source.manifest {manifest}: {describe(exc)}")
    elif not os.access(manifest, os.R_OK) or not os.path.isfile(manifest):
        return Finding("fail", f"source.manifest {manifest}: not a readable file")
    return Finding("ok", f"source.manifest {manifest} is readable")


def _check_ram_dir(config: Config) -> Finding:
    path, budget = config.output.ram_dir, config.output.ram_budget
    fstype = filesystem_type(path)
    free = _free_bytes(path)
    if free is not None and free < budget:
        return Finding(
            "fail",
            f"output.ram_dir {path}: only {format_size(free)} free, "
            f"ram_budget is {format_size(budget)}",
        )
    if fstype != "tmpfs":
        return Finding(
            "warn",
            f"output.ram_dir {path} is on {fstype or 'an unknown filesystem'}, not tmpfs: "
            "shards will go through a disk",
        )
    return Finding("ok", f"output.ram_dir {path} is tmpfs with {format_size(free or 0)} free")


def _check_dir(key: str, path: Path, need: int) -> Finding:
    base = _existing_ancestor(path)
    if not os.access(base, os.W_OK | os.X_OK):
        return Finding("fail", f"{key} {path}: {base} is not writable by this user")
    free = _free_bytes(path)
    if need and free is not None and free < need:
        return Finding(
            "fail", f"{key} {path}: only {format_size(free)} free, need {format_size(need)}"
        )
    return Finding(
        "ok",
        f"{key} {path} is writable" + (f", {format_size(free)} free" if free is not None else ""),
    )


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(_existing_ancestor(path))
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem ``path`` (or its nearest existing ancestor) lives on."""
    target = str(_existing_ancestor(path).resolve())
    best, fstype = "", None
    try:
        with open("/proc/self/mounts", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = target == mount or target.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, fields[2]
    except OSError:
        return None
    return fstype
