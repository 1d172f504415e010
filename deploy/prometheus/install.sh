#!/bin/sh
# Install Prometheus and promtool from Debian for the backfill tests (tests/pipeline/
# test_backfill.py). Idempotent: exits 0 at once when both binaries are on PATH.
#
# The package's maintainer scripts would start a system service listening on :9090;
# the tests run their own instance instead, so this blocks service start-up for the
# duration of the install (policy-rc.d exit 101 = "action forbidden") and leaves no
# service running.
set -eu

if command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1; then
    echo "prometheus: already installed ($(prometheus --version 2>&1 | head -n 1))"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi

sh "$(dirname "$0")/../lib/apt-install-quiet.sh" prometheus

# Belt and braces: if a service manager started it anyway, stop and disable it.
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
    $SUDO systemctl disable --now prometheus || true
fi

prometheus --version 2>&1 | head -n 1
promtool --version 2>&1 | head -n 1
