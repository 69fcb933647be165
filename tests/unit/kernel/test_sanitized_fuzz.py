"""The C record kernel, built with AddressSanitizer and UndefinedBehaviorSanitizer, agrees with
its Python twin on fuzzed tar streams, TFRecord files, lines and draws by source, with no
sanitizer report.

The module is compiled here from ``prefetchd/kernel/_native.c`` (gcc and the Python headers,
which every test machine has) into a temporary directory, and ``fuzz_kernel.py`` drives it in a
process of its own with ``libasan`` preloaded: an out-of-bounds read, a use after free or
undefined behaviour (``-fno-sanitize-recover``) ends that process with a report, which fails
this test. What the build needs and lacks fails the test too, with the reason: it never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SOURCE = ROOT / "prefetchd" / "kernel" / "_native.c"
HTTP_SOURCE = ROOT / "prefetchd" / "kernel" / "_http.c"  # the native GET client's engine
HTTP_EXAMPLES = 2000
SANITIZE = [
    "-fsanitize=address,undefined",
    "-fno-omit-frame-pointer",
    "-fno-sanitize-recover=undefined",
]
EXAMPLES = 500  # per fuzzed function (three of them): ~35 s with the 2 cores loaded 5 times over
REPORTS = ("ERROR: AddressSanitizer", "runtime error:", "SUMMARY: UndefinedBehaviorSanitizer")


def build(out: Path, source: Path = SOURCE, libs: tuple[str, ...] = ()) -> tuple[Path, str]:
    """The sanitized module of ``source`` built into ``out``, and the ``libasan`` to preload."""
    compiler = shutil.which("gcc")
    assert compiler, "gcc is needed to build the sanitized C kernel and is not on PATH"
    include = sysconfig.get_paths()["include"]
    assert (Path(include) / "Python.h").is_file(), f"no Python.h in {include}"
    libasan = subprocess.run(
        [compiler, "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert os.path.isabs(libasan) and os.path.exists(libasan), f"gcc has no libasan ({libasan})"
    module = out / f"{source.stem}{sysconfig.get_config_var('EXT_SUFFIX')}"
    command = [
        compiler,
        *SANITIZE,
        "-g",
        "-O1",
        "-std=c11",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-shared",
        "-fPIC",
        f"-I{include}",
        str(source),
        "-o",
        str(module),
        *libs,
    ]
    made = subprocess.run(command, capture_output=True, text=True)
    assert made.returncode == 0, f"{' '.join(command)} failed:\n{made.stderr}"
    return module, libasan


def test_sanitized_c_kernel_agrees_with_the_twin_on_fuzzed_input(tmp_path: Path) -> None:
    module, libasan = build(tmp_path)
    # the driver loads the sanitized module, not the built one
    ran = run_driver(
        ["-m", "tests.unit.kernel.fuzz_kernel"], module, EXAMPLES, libasan, PREFETCHD_NATIVE="0"
    )
    assert ran.stdout.count("examples agreed") == 4, ran.stdout


def test_sanitized_http_engine_parses_fuzzed_responses_and_serves_faults(tmp_path: Path) -> None:
    """The native GET client's engine (``_http.c``): its response parser on responses drawn
    valid and mutated, split at random, then the engine thread against a scripted server
    (splits, chunked error bodies, closes, hangs, timeouts, cancel, close) — no report."""
    module, libasan = build(tmp_path, HTTP_SOURCE, ("-lz", "-lpthread"))
    ran = run_driver(["-m", "tests.unit.kernel.fuzz_http"], module, HTTP_EXAMPLES, libasan)
    assert ran.stdout.count("examples agreed") == 2, ran.stdout


def run_driver(
    driver: list[str], module: Path, examples: int, libasan: str, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """Run a fuzz driver (``python -m ...`` from the repository root, so ``tests`` imports)
    over the sanitized ``module`` and fail with its output on a non-zero exit or any
    sanitizer report."""
    env = {
        **os.environ,
        "LD_PRELOAD": libasan,
        "PYTHONMALLOC": "malloc",  # Python's buffers as malloc blocks, with red zones
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:halt_on_error=1",  # CPython leaks at exit
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        **extra_env,
    }
    ran = subprocess.run(
        [sys.executable, *driver, str(module), str(examples)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    reports = [r for r in REPORTS if r in ran.stderr]
    assert ran.returncode == 0 and not reports, (
        f"exit status {ran.returncode}, sanitizer reports {reports}\n"
        f"--- stdout\n{ran.stdout[-3000:]}\n--- stderr\n{ran.stderr[-12000:]}"
    )
    return ran
