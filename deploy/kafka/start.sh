#!/usr/bin/env bash
# Start the local single-node KRaft Kafka broker (127.0.0.1:9092) in the background.
#
# Idempotent: returns 0 at once when something already accepts connections on the port.
# Otherwise: resolve the broker jars with Maven (once; cached in var/kafka/lib), format
# the storage (once; var/kafka/data), start kafka.Kafka with Java 17+, and return only
# when the broker answers a metadata request. Fails loudly with the log's tail.
#
# Environment: KAFKA_HEAP_OPTS (default -Xmx512m -Xms128m), KAFKA_START_TIMEOUT_S (90),
#              JAVA_HOME (else `java` on PATH), MVN (default mvn).
set -euo pipefail

cd "$(dirname "$0")/../.."
HOST=127.0.0.1
PORT=9092
CONF=deploy/kafka/server.properties
VAR=var/kafka
LIB=$VAR/lib
DATA=$VAR/data
PIDFILE=$VAR/kafka.pid
LOG=$VAR/kafka.log
TIMEOUT_S=${KAFKA_START_TIMEOUT_S:-90}
HEAP=${KAFKA_HEAP_OPTS:--Xmx512m -Xms128m}
JAVA=${JAVA_HOME:+$JAVA_HOME/bin/}java
MVN=${MVN:-mvn}

say() { echo "kafka: $*" >&2; }
die() {
    say "ERROR: $*"
    if [[ -f $LOG ]]; then say "last lines of $LOG:"; tail -n 40 "$LOG" >&2; fi
    exit 1
}
port_open() { (exec 3<>"/dev/tcp/$HOST/$PORT") 2>/dev/null; }
our_pid_alive() { [[ -f $PIDFILE ]] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
probe() {
    "$JAVA" -Xmx128m -Dlog4j2.level=OFF -Dlog4j2.configurationFile=deploy/kafka/log4j2.xml \
        -cp "$LIB/*" deploy/kafka/Probe.java "$HOST:$PORT" 2>&1 | grep '^kafka\.' || true
}

if port_open; then
    say "something already accepts connections on $HOST:$PORT; not starting another broker"
    exit 0
fi

mkdir -p "$VAR"
# One start at a time (make test and a pytest fixture may race).
exec 9>"$VAR/start.lock"
flock -w "$((TIMEOUT_S + 30))" 9 || die "another start.sh holds $VAR/start.lock"

if ! our_pid_alive; then
    # -- Java 17+
    command -v "$JAVA" >/dev/null || die "java not found: install Java 17+ or set JAVA_HOME"
    jv=$("$JAVA" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p')
    [[ ${jv%%.*} -ge 17 ]] || die "Kafka 4.x needs Java 17+, $JAVA is $jv: set JAVA_HOME"

    # -- jars (resolved once per pom.xml content)
    want=$(sha256sum deploy/kafka/pom.xml | cut -d' ' -f1)
    if [[ $(cat "$LIB/.pom.sha256" 2>/dev/null) != "$want" ]]; then
        command -v "$MVN" >/dev/null || die "mvn not found: install Maven (it resolves the broker jars)"
        say "resolving broker jars with Maven into $LIB"
        rm -rf "$LIB"
        "$MVN" -q -B -Dstyle.color=never -f deploy/kafka/pom.xml dependency:copy-dependencies \
            || die "Maven could not resolve the broker jars (see above)"
        echo "$want" >"$LIB/.pom.sha256"
    fi

    # -- storage (formatted once)
    if [[ ! -f $DATA/meta.properties ]]; then
        cluster_id=$("$JAVA" -cp "$LIB/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
        say "formatting $DATA (cluster id $cluster_id)"
        "$JAVA" -Xmx256m -Dlog4j2.configurationFile=deploy/kafka/log4j2.xml -cp "$LIB/*" \
            kafka.tools.StorageTool format --standalone --cluster-id "$cluster_id" --config "$CONF" \
            >"$VAR/format.log" 2>&1 || { cat "$VAR/format.log" >&2; die "formatting $DATA failed"; }
    fi

    # -- broker
    say "starting broker on $HOST:$PORT (log $LOG)"
    # shellcheck disable=SC2086  # HEAP holds several options
    setsid nohup "$JAVA" $HEAP -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
        -Dlog4j2.configurationFile=deploy/kafka/log4j2.xml -cp "$LIB/*" \
        kafka.Kafka "$CONF" >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
else
    say "broker pid $(cat "$PIDFILE") is already starting; waiting for it"
fi

start=$SECONDS
while ((SECONDS - start < TIMEOUT_S)); do
    our_pid_alive || die "the broker exited during start-up"
    if port_open; then
        out=$(probe)
        if [[ $out == kafka.ready* ]]; then
            say "ready after $((SECONDS - start)) s: $out"
            exit 0
        fi
    fi
    sleep 1
done
die "the broker did not answer a metadata request on $HOST:$PORT within $TIMEOUT_S s (pid $(cat "$PIDFILE" 2>/dev/null))"
