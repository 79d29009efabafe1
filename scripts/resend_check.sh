#!/bin/bash
# Outside check of the resend window (issue 44): a worker process, plain redis-cli XADDs with own
# event_ids (3 busy users x 300 events, 50 light users x 5) republished whole, reversed, and
# after a worker restart; counts scores and each n with redis-cli. Usage: bash scripts/resend_check.sh
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
W=$ROOT/.venv/bin/intentstream
T=$(mktemp -d)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port $PORT --bind 127.0.0.1 --save '' --appendonly no --daemonize yes --pidfile $T/r.pid --logfile $T/r.log
sleep 0.5
C="redis-cli -p $PORT"
$W model init --event-types view,add_to_cart,purchase --hidden 8 --seed 1 --out $T/m.npz > /dev/null
gen() {  # the file's events as redis-cli commands, in order $1 (fwd|rev)
  python3 - "$1" <<'PY'
import sys
ev=[(f"busy{u}", f"busy{u}-e{i}") for i in range(300) for u in range(3)]
ev+=[(f"light{u}", f"light{u}-e{i}") for i in range(5) for u in range(50)]
if sys.argv[1]=="rev": ev=ev[::-1]
for user, eid in ev: print(f"XADD intentstream:events:{{0}} * user_id {user} type view event_id {eid}")
PY
}
start_worker() { $W worker --redis-url redis://127.0.0.1:$PORT --model $T/m.npz --metrics-port 0 --batch-size 64 --log-format json >> $T/w.log 2>&1 & echo $! > $T/w.pid; }
drained() {  # every entry committed: acked is the stream's last id
  local last acked
  last=$($C XREVRANGE 'intentstream:events:{0}' + - COUNT 1 | head -1)
  acked=$($C GET 'intentstream:acked:{0}')
  [ "$last" = "$acked" ]
}
wait_drained() { for i in $(seq 1 600); do drained && return 0; sleep 0.1; done; echo "NOT DRAINED"; }
report() {
  echo "$1: entries $($C XLEN 'intentstream:events:{0}') scores $($C XLEN 'intentstream:scores:{0}') n(busy0)=$($C HGET 'intentstream:state:{0}:busy0' n) n(busy2)=$($C HGET 'intentstream:state:{0}:busy2' n) n(light7)=$($C HGET 'intentstream:state:{0}:light7' n)"
}
start_worker
gen fwd | $C > /dev/null; wait_drained; report "first copy"
gen fwd | $C > /dev/null; wait_drained; report "republished"
gen rev | $C > /dev/null; wait_drained; report "republished reversed"
kill $(cat $T/w.pid); wait $(cat $T/w.pid) 2>/dev/null
start_worker
gen fwd | $C > /dev/null; wait_drained; report "after a restart, republished"
# every score's event_id once
DUP=$($C XRANGE 'intentstream:scores:{0}' - + | awk 'prev=="event_id"{print} {prev=$0}' | sort | uniq -d | wc -l)
echo "event_ids scored more than once: $DUP"
echo "memory of busy0 (bytes): $($C HSTRLEN 'intentstream:state:{0}:busy0' event_ids)"
kill $(cat $T/w.pid); wait $(cat $T/w.pid) 2>/dev/null
$C SHUTDOWN NOSAVE >/dev/null 2>&1
