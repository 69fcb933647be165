#!/usr/bin/env bash
# Every check in one command: set up .venv (scripts/_venv.sh), then ruff check, ruff format
# --check, mypy and pytest. All steps run even if one fails; the exit status is non-zero if
# any failed. Extra arguments go to pytest:
#
#   scripts/test.sh                 # everything, including the fault-injection soak (~1-2 min)
#   PREFETCHD_SKIP_SOAK=1 scripts/test.sh   # everything except the soak
#   scripts/test.sh -k consumer -x  # a subset
set -euo pipefail

# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"

# tests/deploy checks the systemd units with systemd-analyze: on a fresh Debian/Ubuntu machine
# (CI runs as root) install it; elsewhere those tests skip and say why.
if ! command -v systemd-analyze >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing systemd (systemd-analyze, for tests/deploy)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends systemd >/dev/null; } ||
        echo "warning: could not install systemd; the systemd-analyze tests will be skipped"
fi

# tests/stores runs the daemon against a one-node Ceph cluster's S3 gateway (RGW): on a fresh
# Debian/Ubuntu machine as root install it. Without it those tests fail and say what to install
# (the JuiceFS gateway, the other real store there, comes with the dev extra).
if ! command -v radosgw >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "installing Ceph (radosgw ceph-mon ceph-osd, for tests/stores)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends radosgw ceph-mon ceph-osd >/dev/null; } ||
        echo "warning: could not install Ceph; the Ceph RGW tests in tests/stores will fail"
fi

failed=()
step() {
    local name=$1 started=$SECONDS
    shift
    say "$name"
    if "$@"; then
        echo "--- $name: ok ($((SECONDS - started)) s)"
    else
        echo "--- $name: FAILED ($((SECONDS - started)) s)"
        failed+=("$name")
    fi
}

step "ruff check" ruff check .
step "ruff format --check" ruff format --check .
step "mypy" mypy
soak=(--soak)
if [[ ${PREFETCHD_SKIP_SOAK:-0} == 1 ]]; then
    soak=()
fi
# Every test starts daemons (a supervisor and its children): with PYTHONDONTWRITEBYTECODE set,
# each process would compile the package again; write its bytecode once, as pip install would.
python -m compileall -q prefetchd >/dev/null
step "pytest" python -m pytest -q ${soak[@]+"${soak[@]}"} "$@"

echo
if ((${#failed[@]})); then
    echo "FAILED: ${failed[*]}" >&2
    exit 1
fi
echo "all checks passed"
