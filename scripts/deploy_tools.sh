#!/usr/bin/env bash
# promtool and prometheus for the deploy tests, from Debian's prometheus package, unpacked
# into .cache/deploy-tools (not installed: no service starts). Cached: a second run is a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/deploy-tools
if [ -x "$dest/usr/bin/promtool" ] && [ -x "$dest/usr/bin/prometheus" ]; then
    exit 0
fi
echo "fetching Debian's prometheus package for promtool and prometheus (once, into $dest)" >&2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A fresh machine has no package lists; `apt-get download` needs them.
if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    echo "no package lists yet: apt-get update" >&2
    apt-get update -qq
    (cd "$work" && apt-get download -q prometheus)
fi
mkdir -p "$dest"
dpkg-deb -x "$work"/prometheus_*.deb "$dest"
"$dest/usr/bin/promtool" --version | head -1
