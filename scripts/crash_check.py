"""Outside check: a worker holding many partitions, at low traffic, killed with SIGKILL again
and again (or, with --drop-connections, its Redis connections closed under it by CLIENT
KILL; or, with --bump-sequences, left running while another writer moves the partitions'
commit sequences on every few ms, as another worker's commits would, so commits whose
states were read before meet a conflict) while a producer writes; afterwards every event is
scored exactly once and every user's state counts each of its events once.

It drives what a user runs: the installed `intentstream worker` console script, a private
`redis-server` on a free port and plain redis-py XADDs (producers route by crc32(user) mod P);
with --cluster, a local 3-primary Redis Cluster (no replicas; the tests' LocalCluster), the
worker's --cluster and a redis-py cluster client.

    .venv/bin/python scripts/crash_check.py [--partitions 8] [--kills 12] [--rate 400] [--exe PATH]
        [--drop-connections | --bump-sequences] [--cluster]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from pathlib import Path

import redis

from worker.common.local_redis import LocalCluster

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(tmp: Path) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                            stdout=subprocess.DEVNULL)  # fmt: skip
    r = redis.Redis(port=port)
    for _ in range(100):
        try:
            r.ping()
            return proc, port
        except redis.ConnectionError:
            time.sleep(0.05)
    raise SystemExit("redis-server did not start")


OURS = "crash-check"  # the name of this checker's own connections (never dropped)


def client_of(port: int, cluster: bool, **kw) -> redis.Redis | redis.RedisCluster:
    if cluster:
        return redis.RedisCluster(host="127.0.0.1", port=port, client_name=OURS, **kw)
    return redis.Redis(port=port, client_name=OURS, **kw)


def drop_others(ports: list[int]) -> int:
    """CLIENT KILL every connection but this checker's, on each server; how many."""
    dropped = 0
    for port in ports:
        node = redis.Redis(port=port, client_name=OURS)
        for client in node.client_list():
            if client.get("name") != OURS:
                dropped += node.client_kill_filter(_id=client["id"])
    return dropped


def start_worker(
    exe: str, port: int, model: Path, partitions: int, log, cluster: bool = False
) -> subprocess.Popen:
    return subprocess.Popen([exe, "worker", "--redis-url", f"redis://127.0.0.1:{port}/0",
                             "--model", str(model), "--partitions", str(partitions),
                             "--metrics-port", "0", "--batch-size", "64",
                             "--log-format", "json", *(["--cluster"] if cluster else [])],
                            stdout=log, stderr=log)  # fmt: skip


def produce(port: int, partitions: int, rate: float, stop: threading.Event, sent: Counter,
            cluster: bool) -> None:  # fmt: skip
    """XADD one event at a time to its user's partition, about `rate` a second."""
    r = client_of(port, cluster, **({} if cluster else {"single_connection_client": True}))
    users = [f"u{k}" for k in range(300)]
    k = 0
    while not stop.is_set():
        user = random.choice(users)
        p = zlib.crc32(user.encode()) % partitions
        r.xadd(f"intentstream:events:{{{p}}}", {"user_id": user, "type": "view",
                                                "event_id": f"{user}-{k}"})  # fmt: skip
        sent[user] += 1
        k += 1
        time.sleep(1.0 / rate)


def bump(port: int, partitions: int, stop: threading.Event, cluster: bool) -> None:
    """INCR a random partition's commit sequence every ~5 ms: another writer's commit."""
    r = client_of(port, cluster)
    while not stop.is_set():
        r.incr(f"intentstream:seq:{{{random.randrange(partitions)}}}")
        time.sleep(0.005)


def state_key(user: str, partitions: int) -> str:
    return f"intentstream:state:{{{zlib.crc32(user.encode()) % partitions}}}:{user}"


def drained(r: redis.Redis, partitions: int) -> bool:
    for p in range(partitions):
        last = r.xrevrange(f"intentstream:events:{{{p}}}", count=1)
        if last and r.get(f"intentstream:acked:{{{p}}}") != last[0][0]:
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--kills", type=int, default=12)
    ap.add_argument("--rate", type=float, default=400.0)
    ap.add_argument("--drop-connections", action="store_true",
                    help="close the worker's connections (CLIENT KILL) instead")  # fmt: skip
    ap.add_argument("--bump-sequences", action="store_true",
                    help="move the sequences on as another writer would, instead")  # fmt: skip
    ap.add_argument("--cluster", action="store_true", help="a local 3-primary Redis Cluster")
    ap.add_argument(
        "--exe",
        default=str(ROOT / ".venv" / "bin" / "intentstream"),
        help="the intentstream console script to drive",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    if args.cluster:  # three primaries, no replicas, no persistence
        cluster = LocalCluster(masters=3, replicas=0, appendonly=False).start()
        ports, stop_servers = [node.port for node in cluster.nodes], cluster.close
    else:
        server, port = start_redis(tmp)
        ports, stop_servers = [port], lambda: (server.terminate(), server.wait())
    port = ports[0]
    r = client_of(port, args.cluster, decode_responses=True)
    model = tmp / "m.npz"
    subprocess.run([args.exe, "model", "init",
                    "--event-types", "view,add_to_cart,purchase", "--hidden", "8",
                    "--out", str(model)], check=True, capture_output=True)  # fmt: skip
    log = open(tmp / "worker.log", "ab")  # noqa: SIM115 - the workers' log, closed at exit
    worker = start_worker(args.exe, port, model, args.partitions, log, args.cluster)
    stop, sent, dropped = threading.Event(), Counter(), 0
    work = (port, args.partitions, args.rate, stop, sent, args.cluster)
    producer = threading.Thread(target=produce, args=work)
    producer.start()
    bumper = threading.Thread(target=bump, args=(port, args.partitions, stop, args.cluster))
    if args.bump_sequences:
        bumper.start()
    try:
        for _ in range(args.kills):
            time.sleep(random.uniform(1.5, 4.0))
            if args.bump_sequences:
                continue
            if args.drop_connections:
                dropped += drop_others(ports)
                continue
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            worker = start_worker(args.exe, port, model, args.partitions, log, args.cluster)
        time.sleep(2.0)
        stop.set()
        producer.join()
        if args.bump_sequences:
            bumper.join()
        deadline = time.time() + 120
        while not drained(r, args.partitions) and time.time() < deadline:
            time.sleep(0.2)
        ok_drained = drained(r, args.partitions)
        scored: Counter = Counter()
        ids: Counter = Counter()
        for p in range(args.partitions):
            for _, fields in r.xrange(f"intentstream:scores:{{{p}}}"):
                scored[fields["user_id"]] += 1
                ids[fields["event_id"]] += 1
        states = {u: int(r.hget(state_key(u, args.partitions), "n") or 0) for u in sent}
    finally:
        stop.set()
        worker.kill()
        worker.wait()
        stop_servers()
    total = sum(sent.values())
    twice = sum(1 for c in ids.values() if c > 1)
    wrong_n = sum(1 for u, n in sent.items() if states[u] != n)
    missing = total - len(ids)
    log.close()
    logged = (tmp / "worker.log").read_text(errors="replace")
    warned = logged.count('"level": "warning"')
    what = f"drops ({dropped} connections closed)" if args.drop_connections else "SIGKILLs"
    if args.bump_sequences:
        what = f"rounds of sequence bumps ({logged.count('state conflict')} conflicts logged)"
    what += " on a 3-primary cluster" if args.cluster else ""
    print(
        f"{args.kills} {what}, {args.partitions} partitions, {total} events sent; worker "
        f"warnings logged: {warned}; drained: "
        f"{ok_drained}; scored {sum(ids.values())} ({len(ids)} distinct event ids); scored "
        f"twice: {twice}; never scored: {missing}; users whose n is wrong: {wrong_n}"
    )
    ok = ok_drained and not twice and not missing and not wrong_n
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp} (worker.log)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
