"""``python -m bench`` (from the repository root): the benchmark; see ``bench/__init__.py``."""

import sys

from bench.harness.cli import main

sys.exit(main())
