#!/usr/bin/env bash
# One command for the tests on a fresh machine: makes .venv, installs the project with its
# test extra, lints, and runs the suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
# Bytecode cached for the suite's hundreds of Python processes (an image may set this off):
# without it every process compiles the project's modules again (a worker's ~0.08 s of CPU)
# and every pytest worker rewrites the tests' asserts again (collection 5.1 -> 2.7 s of CPU).
unset PYTHONDONTWRITEBYTECODE
source scripts/venv.sh
ensure_venv test
# The Numba kernels, compiled once before pytest's workers (and the commands they run) would
# each compile them: three processes of about equal CPU on the two cores (training and scoring
# 25 s each; evaluation 9, then the gradient checks' float64 kernels 22, tests/kernels.py).
# Training and scoring start first, beside the tools' installs and the linters, which mostly
# wait on the disk and the network (~10 s of a clean clone's run).
.venv/bin/python -m worker.commands.kernels training &
training=$!
.venv/bin/python -m worker.commands.kernels scoring &
scoring=$!
trap 'kill "$training" "$scoring" 2>/dev/null || true' EXIT  # a failed step leaves none behind
bash scripts/deploy_tools.sh  # promtool and prometheus for the deploy tests (cached)
bash scripts/browser_tools.sh  # Debian's chromium for the console's browser tests (once)
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/lint-imports --no-cache  # the wings' import contracts (pyproject.toml)
.venv/bin/python -m worker.commands.kernels evaluation
.venv/bin/python -m tests.kernels
wait "$training"
wait "$scoring"
trap - EXIT
# Four workers on two cores: most integration tests wait on redis-server, workers and
# commands they start, so two workers per core keep both busy. A file's tests stay on one
# worker (--dist loadfile), so its module fixtures (a cluster, a trained model) start once.
# The files go out in tests/conftest.py's order, the longest first (xdist would sort them by
# their count of tests: test_longrange's 4 tests, 40 s of CPU, went out in the last quarter).
# INTENTSTREAM_TEST_WORKERS=0 runs them in this process, one after another.
.venv/bin/python -m pytest -n "${INTENTSTREAM_TEST_WORKERS:-4}" --dist loadfile \
    --no-loadscope-reorder "$@"
