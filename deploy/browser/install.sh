#!/bin/sh
# Install Debian's chromium and chromium-driver for the dashboard's browser test
# (tests/api/test_browser.py: headless chromium driven by Selenium). Idempotent: exits 0
# at once when both binaries are on PATH.
set -eu

have() {
    command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1
}

if ! have; then
    sh "$(dirname "$0")/../lib/apt-install-quiet.sh" chromium chromium-driver
fi

chromium --version 2>/dev/null | head -n 1 || echo "chromium: installed (--version failed)"
chromedriver --version | head -n 1
