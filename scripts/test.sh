#!/usr/bin/env bash
# One command for the tests on a fresh machine: makes .venv, installs the project with its
# test extra, lints, and runs the suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv.sh
ensure_venv test
bash scripts/deploy_tools.sh  # promtool and prometheus for the deploy tests (cached)
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache  # the wings' import contracts (pyproject.toml)
.venv/bin/python -m pytest "$@"
