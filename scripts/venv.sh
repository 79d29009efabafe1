#!/usr/bin/env bash
# Makes .venv if missing and installs the project with the extras given ("test", "demo").
# Sourced by test.sh and demo.sh; run from the repository root.
ensure_venv() {
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$1]"
}
