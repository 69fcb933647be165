"""The systemd units as systemd itself reads them (``systemd-analyze verify``), and the
settings docs/operations.md promises operators."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "systemd"
SHIPPED_EXEC = "/opt/prefetchd/bin/prefetchd"
ANALYZE = shutil.which("systemd-analyze")

needs_analyze = pytest.mark.skipif(
    ANALYZE is None,
    reason="systemd-analyze is not installed; scripts/test.sh installs it (apt-get install "
    "systemd) when run as root on Debian/Ubuntu",
)


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections as {section: {key: [values...]}} (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (UNITS / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """The units copied as an operator installs them, ExecStart pointing at this checkout's
    ``prefetchd`` (verify checks that the command exists), the RAM-disk drop-in in place."""
    prefetchd = Path(sys.executable).with_name("prefetchd")
    if not prefetchd.exists():
        pytest.skip(f"{prefetchd} is not installed (pip install -e . puts it there)")
    text = (UNITS / "prefetchd@.service").read_text()
    assert SHIPPED_EXEC in text
    (tmp_path / "prefetchd@.service").write_text(text.replace(SHIPPED_EXEC, str(prefetchd)))
    shutil.copy(UNITS / "mnt-prefetchd.mount", tmp_path)
    dropins = tmp_path / "prefetchd@.service.d"
    dropins.mkdir()
    shutil.copy(UNITS / "prefetchd-ram.conf", dropins / "ram.conf")
    return tmp_path


def verify(directory: Path, *units: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, "verify", *units],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs_analyze
def test_systemd_analyze_verify_accepts_the_units(installed: Path) -> None:
    proc = verify(installed, "prefetchd@train.service", "mnt-prefetchd.mount")
    # verify exits 0 on unknown keys but says so; any remark about our files is a failure
    ours = [
        line for line in proc.stderr.splitlines() if str(installed) in line or "prefetchd" in line
    ]
    assert proc.returncode == 0, proc.stderr
    assert not ours, "\n".join(ours)


@needs_analyze
def test_systemd_analyze_verify_catches_a_broken_unit(installed: Path) -> None:
    """The check above has teeth: a misspelt key and a missing program are reported."""
    path = installed / "prefetchd@.service"
    path.write_text(path.read_text().replace("Type=notify", "Tpye=notify"))
    proc = verify(installed, "prefetchd@train.service")
    assert "Tpye" in proc.stderr
    path.write_text(re.sub(r"ExecStart=\S+", "ExecStart=/nonexistent/prefetchd", path.read_text()))
    assert verify(installed, "prefetchd@train.service").returncode != 0


@needs_analyze
def test_hardening_exposure_is_ok(installed: Path) -> None:
    assert ANALYZE is not None
    proc = subprocess.run(
        [ANALYZE, "security", "--offline=yes", "--no-pager", "prefetchd@train.service"],
        cwd=installed,
        capture_output=True,
        text=True,
        timeout=120,
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", proc.stdout + proc.stderr)
    assert m, proc.stdout + proc.stderr
    assert float(m.group(1)) <= 4.0, proc.stdout  # systemd calls <= 4.0 "OK"


def test_service_is_a_notify_daemon_with_watchdog_restart_and_hardening() -> None:
    svc = unit("prefetchd@.service")["Service"]
    one = {k: v[-1] for k, v in svc.items()}
    assert one["Type"] == "notify"
    assert one["ExecStart"] == f"{SHIPPED_EXEC} run --config /etc/prefetchd/%i.yaml"
    assert one["Restart"] == "on-failure"
    assert one["KillMode"] == "mixed"
    assert one["WatchdogSec"]
    assert one["UMask"] == "0077"
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert one[key] == "yes", key
    assert one["ProtectSystem"] == "strict"
    assert one["StateDirectory"] == "prefetchd/%i"
    assert one["CacheDirectory"] == "prefetchd/%i"
    # /dev/shm must stay shared with the trainer: no private /dev
    assert "PrivateDevices" not in one


def _seconds(value: str) -> float:
    units = {"min": 60, "s": 1, "ms": 0.001, "h": 3600}
    m = re.fullmatch(r"([0-9.]+)\s*(min|ms|s|h)?", value)
    assert m, value
    return float(m.group(1)) * units[m.group(2) or "s"]


def test_stop_timeout_covers_the_drain_and_the_watchdog_covers_a_restart_backoff() -> None:
    from prefetchd.supervise import children, status_writer, supervisor

    svc = {k: v[-1] for k, v in unit("prefetchd@.service")["Service"].items()}
    assert _seconds(svc["TimeoutStopSec"]) >= supervisor.STOP_GRACE + 5
    # a child in backoff pauses the pings for up to BACKOFF_MAX; that alone must not kill us
    assert _seconds(svc["WatchdogSec"]) > children.BACKOFF_MAX + status_writer.HEALTHY_HEARTBEAT


def test_the_drop_in_and_mount_agree_on_the_ram_disk() -> None:
    mount = unit("mnt-prefetchd.mount")["Mount"]
    where = mount["Where"][-1]
    assert mount["Type"] == ["tmpfs"]
    options = mount["Options"][-1].split(",")
    assert {"nosuid", "nodev", "noexec"} <= set(options)
    assert any(o.startswith("size=") for o in options)
    # a mount unit's name is its escaped path
    assert where.strip("/").replace("/", "-") + ".mount" == "mnt-prefetchd.mount"
    dropin = unit("prefetchd-ram.conf")
    assert dropin["Unit"]["RequiresMountsFor"] == [where]
    assert f"{where}/%i" in dropin["Service"]["ExecStartPre"][-1]
    svc = unit("prefetchd@.service")["Service"]
    assert f"-{where}" in svc["ReadWritePaths"]
