#!/bin/bash
# A command run on two code trees in turn, pair after pair: REV's tree (exported from git to a
# temporary directory) and this checkout's working tree, each run with PYTHONPATH and the working
# directory at its tree, so the installed `intentstream` and `python` run that tree's code. Every
# line a run prints is prefixed with "base" or "this".
#
# Why: on a shared 2-vCPU VM the same tree's figures drift by more than a change is worth over a
# few minutes (docs/experiments.md, Open leads), so two trees measured one after the other mislead;
# alternated every run, the drift weighs on both alike. Give the command few rounds a run and many
# pairs. Each side runs its own tree's bench too: compare trees whose worker/bench agree.
#
# Usage: bash scripts/ab_trees.sh REV PAIRS COMMAND [ARG...]
#   e.g. bash scripts/ab_trees.sh HEAD~3 5 intentstream bench --workers 1 --partitions 1,8 \
#          --rounds 2 --events 5000 --latency-rate 1000 --latency-seconds 8
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,14p "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
REV=$1 PAIRS=$2
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASE=$(mktemp -d)
trap 'rm -rf "$BASE"' EXIT
git -C "$ROOT" archive "$REV" | tar -x -C "$BASE"
[ -f "$ROOT/.venv/bin/activate" ] && source "$ROOT/.venv/bin/activate"
for pair in $(seq 1 "$PAIRS"); do
  for side in base this; do
    tree=$([ $side = base ] && echo "$BASE" || echo "$ROOT")
    echo "== $side, pair $pair of $PAIRS ($(cut -d' ' -f1 /proc/loadavg) load)"
    (cd "$tree" && PYTHONPATH="$tree" "$@") 2>&1 | sed "s/^/$side /"
  done
done
