#!/bin/sh
# Install Prometheus, promtool, Alertmanager and amtool from Debian for the tests that run
# them (backfill, the Grafana dashboard's queries, the rules' unit tests, the
# Alertmanager sink and route example). Idempotent: exits 0 at once when all four
# binaries are on PATH.
#
# The packages' maintainer scripts would start system services listening on :9090 and
# :9093; the tests run their own instances instead, so this blocks service start-up for
# the duration of the install (policy-rc.d exit 101 = "action forbidden") and leaves no
# service running.
set -eu

have() {
    for bin in prometheus promtool prometheus-alertmanager amtool; do
        command -v "$bin" >/dev/null 2>&1 || return 1
    done
}

if have; then
    echo "prometheus: already installed ($(prometheus --version 2>&1 | head -n 1))"
    echo "alertmanager: already installed ($(prometheus-alertmanager --version 2>&1 | head -n 1))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi

sh "$(dirname "$0")/../lib/apt-install-quiet.sh" prometheus prometheus-alertmanager

# Belt and braces: if a service manager started it anyway, stop and disable it.
for unit in prometheus prometheus-alertmanager; do
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$unit" 2>/dev/null; then
        $SUDO systemctl disable --now "$unit" || true
    fi
done

prometheus --version 2>&1 | head -n 1
promtool --version 2>&1 | head -n 1
prometheus-alertmanager --version 2>&1 | head -n 1
