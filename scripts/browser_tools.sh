#!/usr/bin/env bash
# Headless Chromium for the console's browser tests: Debian's chromium package, installed
# system-wide when missing and this runs as root (the tests drive it with Playwright's Python
# package through executable_path). Idempotent: a second run is a no-op. Not root and no
# chromium: says so and fails, so CI fails loudly instead of skipping the browser tests.
set -euo pipefail
browser=${INTENTSTREAM_CHROMIUM:-/usr/bin/chromium}
if [ -x "$browser" ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    echo "no $browser and not root: install Debian's chromium (apt-get install chromium)" >&2
    exit 1
fi
echo "installing Debian's chromium for the console's browser tests (once)" >&2
export DEBIAN_FRONTEND=noninteractive
# A fresh machine has no package lists; apt-get install needs them.
if ! apt-get install -y -qq --no-install-recommends chromium >/dev/null 2>&1; then
    echo "no package lists yet (or stale): apt-get update" >&2
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
"$browser" --version
