#!/bin/sh
# Fills NUMBA_CACHE_DIR with the scoring and worker kernels at image build, so a container does not
# compile at start: scores a few events with throwaway models through the installed CLI.
set -eu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
events='{"user_id":"u","type":"view","ts":1000}
{"user_id":"u","type":"add_to_cart","ts":5000}
{"user_id":"v","type":"other","ts":9000}'
for cell in rnn gru; do
    for layers in 1 2; do
        for features in "" gap; do
            model="$tmp/m-$cell-$layers-$features.npz"
            intentstream model init --cell "$cell" --event-types view,add_to_cart,purchase \
                --layers "$layers" --hidden 8 --features "$features" --out "$model" >/dev/null
            echo "$events" | intentstream score --model "$model" >/dev/null
        done
    done
done
# the worker's own kernels (its histories and item memories) beside the model's
python -m worker.commands.kernels scoring
echo "numba cache filled: $(find "${NUMBA_CACHE_DIR:?set NUMBA_CACHE_DIR}" -name '*.nbc' | wc -l) kernels"
