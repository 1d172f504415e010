#!/usr/bin/env bash
# Stop the broker started by deploy/kafka/start.sh and wait until it has exited.
# Environment: KAFKA_STOP_TIMEOUT_S (default 60; then it is killed).
set -euo pipefail

cd "$(dirname "$0")/../.."
PIDFILE=var/kafka/kafka.pid
TIMEOUT_S=${KAFKA_STOP_TIMEOUT_S:-60}

say() { echo "kafka: $*" >&2; }

if [[ ! -f $PIDFILE ]]; then
    say "not running (no $PIDFILE)"
    exit 0
fi
pid=$(cat "$PIDFILE")
if ! kill -0 "$pid" 2>/dev/null; then
    say "not running (stale pid $pid)"
    rm -f "$PIDFILE"
    exit 0
fi
# Only signal the process if it is our broker, not a recycled pid.
if ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka'; then
    say "pid $pid is not a Kafka broker; removing stale $PIDFILE"
    rm -f "$PIDFILE"
    exit 0
fi

say "stopping broker pid $pid"
kill -TERM "$pid"
start=$SECONDS
while kill -0 "$pid" 2>/dev/null; do
    if ((SECONDS - start >= TIMEOUT_S)); then
        say "pid $pid still alive after $TIMEOUT_S s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 1
        break
    fi
    sleep 0.2
done
rm -f "$PIDFILE"
say "stopped after $((SECONDS - start)) s"
