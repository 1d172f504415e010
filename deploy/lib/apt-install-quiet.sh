#!/bin/sh
# Install Debian packages without letting their maintainer scripts start system services
# (the tests run their own instances): policy-rc.d exit 101 ("action forbidden") for the
# duration of the install, removed afterwards even on failure. Needs root or sudo.
#
#     sh deploy/lib/apt-install-quiet.sh PACKAGE...
set -eu

[ "$#" -gt 0 ] || { echo "usage: $0 PACKAGE..." >&2; exit 2; }
if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi

policy=/usr/sbin/policy-rc.d
added_policy=
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
    added_policy=1
fi
cleanup() {
    if [ -n "$added_policy" ]; then $SUDO rm -f "$policy"; fi
}
trap cleanup EXIT INT TERM

$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "$@" >/dev/null
