"""``prefetchd.records`` and ``prefetchd.example`` load no framework, and ``import prefetchd``
loads neither them nor the trainer side until they are used."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("tensorflow", "torch", "jax", "numpy")

PROBE = """
import sys
import prefetchd
before = set(sys.modules)
records = prefetchd.records
import prefetchd.example
print(",".join(sorted(m for m in {frameworks} if m in sys.modules)))
print("prefetchd.consume.records" in before)
"""


def test_records_and_the_decoder_import_no_framework() -> None:
    code = PROBE.format(frameworks=FRAMEWORKS)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    loaded, eager = proc.stdout.splitlines()
    assert loaded == "", f"imported {loaded}"
    assert eager == "False", "import prefetchd loaded records() before it was used"
