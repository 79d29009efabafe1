#!/bin/sh
# Fills NUMBA_CACHE_DIR with the scoring and worker kernels at image build, so a container does not
# compile at start. The kernels are one set for every cell, depth and feature list (the cell is a
# value the kernels read, not a compiled variant): `kernels scoring` compiles them all, and one
# model scored through the installed CLI checks the image's command at build.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python -m worker.commands.kernels scoring
intentstream model init --cell gru --event-types view,add_to_cart,purchase --layers 2 \
    --hidden 8 --features gap --out "$tmp/model.npz" >/dev/null
printf '%s\n' '{"user_id":"u","type":"view","ts":1000}' '{"user_id":"u","type":"add_to_cart","ts":5000}' \
    '{"user_id":"v","type":"other","ts":9000}' |
    intentstream score --model "$tmp/model.npz" >/dev/null
echo "numba cache filled: $(find "${NUMBA_CACHE_DIR:?set NUMBA_CACHE_DIR}" -name '*.nbc' | wc -l) kernels"
