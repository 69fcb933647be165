"""What each daemon process imports before it works, counted rather than timed: the CPU the
daemon spends before its first GET is mostly imports (docs/benchmarks.md, "Start-up CPU"), so
a module creeping into a role that does not need it shows here.

A spawned child (multiprocessing "spawn") first runs the parent's main script again as
``__mp_main__`` (the ``prefetchd`` entry point, or ``prefetchd/__main__.py`` under
``python -m prefetchd``), then unpickles its entry (``roles.table``) and its config, then
imports its role. Each case below does the same in a fresh interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# How spawn re-runs each kind of main script in a child.
MAIN_SCRIPTS = {
    "entry point": "import prefetchd.commands.cli",
    "python -m": "import runpy; runpy.run_module('prefetchd.__main__', run_name='__mp_main__')",
}
CHILD = "import prefetchd.roles.table, prefetchd.roles.shell, prefetchd.config"
ROLES = {
    "supervisor": (
        "from prefetchd.commands.cli import main; "
        "from prefetchd.supervise.supervisor import Supervisor"
    ),
    "writer": f"{CHILD}; import prefetchd.write.writer",
    "downloader": (
        f"{CHILD}; import prefetchd.download.downloader, prefetchd.download.crt, "
        "prefetchd.download.classic"
    ),
}
S3 = {"boto3", "botocore", "s3transfer", "awscrt"}
# Never in that role's process; a top-level package name stands for all its modules.
FORBIDDEN = {
    "supervisor": S3
    | {"prefetchd.download.downloader", "prefetchd.download.store", "prefetchd.write.writer"},
    # a child gets its config unpickled, never parsed, and never draws the status table
    "writer": S3 | {"yaml", "prefetchd.download", "prefetchd.supervise.status"},
    # botocore signs and retries the downloader's requests; boto3 would add s3transfer
    "downloader": {"boto3", "s3transfer", "yaml", "prefetchd.supervise.status"},
}


def imported(code: str) -> set[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    return set(json.loads(proc.stdout.splitlines()[-1]))


def offending(modules: set[str], forbidden: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == f or m.startswith(f + ".") for f in forbidden))


@pytest.mark.parametrize("main", list(MAIN_SCRIPTS))
@pytest.mark.parametrize("role", ["writer", "downloader"])
def test_a_spawned_child_imports_only_what_its_role_needs(main: str, role: str) -> None:
    modules = imported(f"{MAIN_SCRIPTS[main]}\n{ROLES[role]}")
    assert f"prefetchd.{'write.writer' if role == 'writer' else 'download.downloader'}" in modules
    assert not offending(modules, FORBIDDEN[role])


def test_the_supervisor_imports_no_s3_client_and_no_stage() -> None:
    modules = imported(ROLES["supervisor"])
    assert "prefetchd.supervise.supervisor" in modules
    assert not offending(modules, FORBIDDEN["supervisor"])


def test_the_downloader_signs_with_botocore() -> None:
    """The forbidden list above is not vacuous: the downloader does load botocore."""
    assert {"botocore", "awscrt"} <= imported(ROLES["downloader"])
