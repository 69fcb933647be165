#!/usr/bin/env bash
# The whole product in one command, on a fresh machine:
#
#   1. set up .venv with prefetchd[dev,tf,crt] (scripts/_venv.sh; fast when already done)
#   2. start a local S3 server (moto) on 127.0.0.1
#   3. upload a synthetic TFRecord dataset with unique record ids
#   4. write a config into a private temp dir (shards go to a private dir under /dev/shm)
#   5. `prefetchd check`, then `prefetchd run` in the background
#   6. train a tiny Keras model from the daemon's shards (testkit/demo_train.py), printing
#      `prefetchd status` while it runs, and check every record arrived once per epoch
#   7. wait for the daemon to exit 0 after the last epoch
#
# Everything it starts is stopped by PID, and its temp dirs removed, on success, failure or
# Ctrl-C. Knobs (environment): DEMO_OBJECTS (64), DEMO_MIN_SIZE (1MiB), DEMO_MAX_SIZE (8MiB),
# DEMO_EPOCHS (2), DEMO_STATUS_EVERY (10 s), DEMO_TIMEOUT (300 s), DEMO_KEEP=1 keeps the
# temp dir (config, logs) for a look afterwards.
set -euo pipefail

DEMO_OBJECTS=${DEMO_OBJECTS:-64}
DEMO_MIN_SIZE=${DEMO_MIN_SIZE:-1MiB}
DEMO_MAX_SIZE=${DEMO_MAX_SIZE:-8MiB}
DEMO_EPOCHS=${DEMO_EPOCHS:-2}
DEMO_STATUS_EVERY=${DEMO_STATUS_EVERY:-10}
DEMO_TIMEOUT=${DEMO_TIMEOUT:-300}
DEMO_KEEP=${DEMO_KEEP:-0}
BUCKET=prefetchd-demo
PREFIX=train/

# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"

WORK=""
SHM=""
DAEMON_PID=""
TRAIN_PID=""

# True while process $1 runs; a zombie (exited, not yet reaped by `wait`) counts as stopped.
running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ ${stat:0:1} != [ZX] ]]
}

# Wait up to $2 seconds for process $1 to stop.
wait_stopped() {
    local deadline=$((SECONDS + $2))
    while running "$1" && ((SECONDS < deadline)); do
        sleep 0.2
    done
    ! running "$1"
}

# The daemon's state from `status --json` (starting, running, ...), or "unknown".
daemon_state() {
    prefetchd status --config "$CONFIG" --json 2>/dev/null |
        python -c 'import json, sys; print(json.load(sys.stdin)["state"])' 2>/dev/null ||
        echo unknown
}

stop_daemon() {
    [ -n "$DAEMON_PID" ] || return 0
    if running "$DAEMON_PID"; then
        echo "stopping prefetchd (pid $DAEMON_PID): SIGTERM, then SIGKILL after 20 s"
        # The daemon leads its own process group (setsid), so the group signal reaches children
        # even if the supervisor is gone; fall back to the PID alone.
        kill -TERM -- "-$DAEMON_PID" 2>/dev/null || kill -TERM "$DAEMON_PID" 2>/dev/null || true
        wait_stopped "$DAEMON_PID" 20 || true
    fi
    kill -KILL -- "-$DAEMON_PID" 2>/dev/null || kill -KILL "$DAEMON_PID" 2>/dev/null || true
    wait "$DAEMON_PID" 2>/dev/null || true
    DAEMON_PID=""
}

cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    if [ -n "$TRAIN_PID" ] && running "$TRAIN_PID"; then
        echo "stopping the trainer (pid $TRAIN_PID)"
        kill -TERM "$TRAIN_PID" 2>/dev/null
        wait_stopped "$TRAIN_PID" 10 || kill -KILL "$TRAIN_PID" 2>/dev/null
    fi
    [ -z "$TRAIN_PID" ] || wait "$TRAIN_PID" 2>/dev/null
    stop_daemon
    if [ -n "$WORK" ] && [ -f "$WORK/moto.pid" ]; then
        python -m testkit.s3server stop --pid-file "$WORK/moto.pid"
    fi
    if ((rc != 0)) && [ -n "$WORK" ] && [ -s "$WORK/prefetchd.log" ]; then
        echo "--- last lines of the daemon's log ($WORK/prefetchd.log) ---"
        tail -n 40 "$WORK/prefetchd.log"
    fi
    [ -z "$SHM" ] || rm -rf "$SHM"
    if [ -n "$WORK" ]; then
        if [ "$DEMO_KEEP" = 1 ]; then
            echo "kept $WORK (DEMO_KEEP=1)"
        else
            rm -rf "$WORK"
        fi
    fi
    if ((rc == 0)); then
        say "demo finished: everything it started is stopped and its temp dirs are removed"
    else
        say "demo FAILED (exit $rc); everything it started is stopped"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ ! -d /dev/shm ] || [ ! -w /dev/shm ]; then
    echo "error: the demo needs a writable /dev/shm (tmpfs) for the shards" >&2
    exit 1
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/prefetchd-demo.XXXXXX")
SHM=$(mktemp -d /dev/shm/prefetchd-demo.XXXXXX)
CONFIG="$WORK/prefetchd.yaml"

# The local server accepts any credentials; these keep boto3 away from real ones (and from
# ~/.aws) for this script and everything it starts.
export AWS_ACCESS_KEY_ID=AKIAFAKEDEMOKEY AWS_SECRET_ACCESS_KEY=fake-demo-secret-key
export AWS_DEFAULT_REGION=us-east-1 AWS_EC2_METADATA_DISABLED=true
export AWS_CONFIG_FILE="$WORK/no-aws-config" AWS_SHARED_CREDENTIALS_FILE="$WORK/no-aws-credentials"
unset AWS_PROFILE AWS_DEFAULT_PROFILE AWS_SESSION_TOKEN AWS_REGION AWS_ENDPOINT_URL AWS_ENDPOINT_URL_S3
export TF_CPP_MIN_LOG_LEVEL=2

say "starting a local S3 server (moto) on 127.0.0.1"
python -m testkit.s3server moto --port-file "$WORK/moto.port" --pid-file "$WORK/moto.pid" \
    --log-file "$WORK/moto.log" >/dev/null
ENDPOINT="http://127.0.0.1:$(cat "$WORK/moto.port")"
echo "S3 endpoint $ENDPOINT (pid $(cat "$WORK/moto.pid"))"

say "uploading $DEMO_OBJECTS TFRecord objects of $DEMO_MIN_SIZE-$DEMO_MAX_SIZE to s3://$BUCKET/$PREFIX"
python -m testkit.sample_data --endpoint "$ENDPOINT" --bucket "$BUCKET" --prefix "$PREFIX" \
    --kind tfrecord --objects "$DEMO_OBJECTS" --min-size "$DEMO_MIN_SIZE" \
    --max-size "$DEMO_MAX_SIZE" --seed 0 --summary-json "$WORK/dataset.json"

say "writing the config $CONFIG"
cat >"$CONFIG" <<EOF
# Written by scripts/demo.sh for one run; configs/example.yaml explains every key.
source:
  url: s3://$BUCKET/$PREFIX
  endpoint_url: $ENDPOINT
  region: us-east-1
  format: tfrecord
epochs:
  count: $DEMO_EPOCHS
  shuffle: true
  seed: 0
download:
  cache_dir: $WORK/cache
  window: 128MiB
  concurrency: 16
  part_size: 8MiB
  client: classic
output:
  ram_dir: $SHM/ram
  ram_budget: 256MiB
  writers: 2
  shard_size: 32MiB
  mix: 8
status:
  state_dir: $WORK/state
log:
  level: info
EOF
chmod 600 "$CONFIG"
sed 's/^/    /' "$CONFIG"

say "prefetchd check --config $CONFIG"
prefetchd check --config "$CONFIG"

say "starting prefetchd run --config $CONFIG (log: $WORK/prefetchd.log)"
if command -v setsid >/dev/null; then
    setsid prefetchd run --config "$CONFIG" >"$WORK/prefetchd.log" 2>&1 &
else
    prefetchd run --config "$CONFIG" >"$WORK/prefetchd.log" 2>&1 &
fi
DAEMON_PID=$!
echo "prefetchd pid $DAEMON_PID"
deadline=$((SECONDS + 60))
until prefetchd status --config "$CONFIG" >/dev/null 2>&1; do
    if ! running "$DAEMON_PID"; then
        echo "error: prefetchd exited during start-up" >&2
        exit 1
    fi
    if ((SECONDS > deadline)); then
        echo "error: prefetchd status still reports 'not running' after 60 s" >&2
        exit 1
    fi
    sleep 0.5
done
# Show a table once the daemon is past start-up (a few seconds at most).
deadline=$((SECONDS + 30))
while [ "$(daemon_state)" = starting ] && ((SECONDS < deadline)); do
    sleep 0.5
done
prefetchd status --config "$CONFIG" || true

say "training a small Keras model from the shards (testkit/demo_train.py)"
python -m testkit.demo_train --config "$CONFIG" --expect "$WORK/dataset.json" \
    --epochs "$DEMO_EPOCHS" --timeout 120 &
TRAIN_PID=$!
next_status=$((SECONDS + DEMO_STATUS_EVERY))
while running "$TRAIN_PID"; do
    sleep 0.5
    if ((SECONDS >= next_status)) && running "$TRAIN_PID"; then
        echo "--- prefetchd status ($(date +%T)) ---"
        prefetchd status --config "$CONFIG" || true
        next_status=$((SECONDS + DEMO_STATUS_EVERY))
    fi
done
train_rc=0
wait "$TRAIN_PID" || train_rc=$?
TRAIN_PID=""
if ((train_rc != 0)); then
    echo "error: the training loop failed (exit $train_rc)" >&2
    exit 1
fi

say "prefetchd status at the end"
prefetchd status --config "$CONFIG" || true

say "waiting for prefetchd to exit after the last epoch (up to $DEMO_TIMEOUT s)"
if ! wait_stopped "$DAEMON_PID" "$DEMO_TIMEOUT"; then
    echo "error: prefetchd still running $DEMO_TIMEOUT s after the last epoch was consumed" >&2
    exit 1
fi
daemon_rc=0
wait "$DAEMON_PID" || daemon_rc=$?
DAEMON_PID=""
if ((daemon_rc != 0)); then
    echo "error: prefetchd exited with code $daemon_rc (expected 0)" >&2
    exit 1
fi
echo "prefetchd exited 0"
