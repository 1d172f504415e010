#!/bin/sh
# Stop the test cluster started by deploy/slurm/start.sh (slurmd x4, slurmctld, munged).
# Idempotent: does nothing when nothing runs. Leaves $FLEETCARE_SLURM_DIR in place.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${FLEETCARE_SLURM_DIR:-$ROOT/var/slurm}

stop() {  # stop PIDFILE: TERM, wait up to 10 s, then KILL
    [ -s "$1" ] || return 0
    pid=$(cat "$1")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        i=0
        while kill -0 "$pid" 2>/dev/null && [ "$i" -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

for f in "$DIR"/slurmd-*.pid; do [ -e "$f" ] && stop "$f"; done
stop "$DIR/slurmctld.pid"
stop "$DIR/munge/munged.pid"
echo "slurm: stopped"
