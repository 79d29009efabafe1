"""Outside check of the producers' path: the installed `intentstream publish` writing events of
several partitions in one FCALL a pipeline, falling back to one call a partition when an older
library (without intentstream_append_many_v1) is loaded, and the installed `intentstream worker`
scoring every event once.

It drives what a user runs: the console scripts, a private `redis-server` on a free port (the
tests' LocalRedis), and plain redis-py to read the result (INFO commandstats, the streams).

    .venv/bin/python scripts/producer_check.py [--partitions 4] [--events 500] [--exe PATH]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections import Counter
from pathlib import Path

import redis

from worker.common.local_redis import LocalRedis

ROOT = Path(__file__).resolve().parents[1]
MANY = "intentstream_append_many_v1"


def fcalls(r: redis.Redis) -> int:
    """FCALLs Redis ran since its last CONFIG RESETSTAT."""
    return int(r.info("commandstats").get("cmdstat_fcall", {}).get("calls", 0))


def publish(exe: str, url: str, partitions: int, first: int, n: int) -> None:
    """Events first..first+n-1 as JSON lines into `intentstream publish`."""
    lines = "\n".join(json.dumps({"user_id": f"u{i % 97}", "type": "view", "event_id": f"e{i}"})
                      for i in range(first, first + n))  # fmt: skip
    done = subprocess.run([exe, "publish", "--redis-url", url, "--partitions", str(partitions)],
                          input=lines.encode(), capture_output=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"publish failed: {done.stderr.decode()[-2000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--events", type=int, default=500, help="events a publish (two publishes)")
    ap.add_argument("--exe", default=str(ROOT / ".venv" / "bin" / "intentstream"))
    args = ap.parse_args()
    tmp, p = Path(tempfile.mkdtemp()), args.partitions
    server = LocalRedis(appendonly=False).start()
    r = redis.Redis(port=server.port, decode_responses=True)
    url = server.url
    model = tmp / "m.npz"
    log = open(tmp / "worker.log", "ab")  # noqa: SIM115 - the worker's log, closed at exit
    worker = None
    try:
        init = [args.exe, "model", "init", "--event-types", "view,add_to_cart,purchase",
                "--hidden", "8", "--out", str(model)]  # fmt: skip
        subprocess.run(init, check=True, capture_output=True)
        worker = subprocess.Popen([args.exe, "worker", "--redis-url", url, "--partitions", str(p),
                                   "--model", str(model), "--metrics-port", "0"],
                                  stdout=log, stderr=log)  # fmt: skip
        deadline = time.time() + 60
        while not r.exists("intentstream:route:{0}") and time.time() < deadline:
            time.sleep(0.1)  # the worker's start records the routes and loads the library
        r.config_resetstat()
        publish(args.exe, url, p, 0, args.events)
        one_call = fcalls(r)
        listed = r.function_list(library="intentstream_v1", withcode=True)[0]
        library = dict(zip(listed[::2], listed[1::2], strict=True))["library_code"]
        r.function_load(library.replace(f"redis.register_function('{MANY}', append_many)\n", ""),
                        replace=True)  # fmt: skip
        r.config_resetstat()
        publish(args.exe, url, p, args.events, args.events)
        older = fcalls(r)
        total = 2 * args.events
        entries: Counter = Counter()
        misplaced = 0
        for k in range(p):
            for _, fields in r.xrange(f"intentstream:events:{{{k}}}"):
                misplaced += zlib.crc32(fields["user_id"].encode()) % p != k
                entries[fields["event_id"]] += 1
        deadline = time.time() + 60
        while time.time() < deadline:
            if sum(r.xlen(f"intentstream:scores:{{{k}}}") for k in range(p)) >= total:
                break
            time.sleep(0.2)
        scored: Counter = Counter()
        for k in range(p):
            for _, fields in r.xrange(f"intentstream:scores:{{{k}}}"):
                scored[fields["event_id"]] += 1
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(30)
        log.close()
        server.close()
    twice = sum(c > 1 for c in scored.values())
    print(f"{p} partitions: {args.events} events in {one_call} FCALL(s); with an older library "
          f"{args.events} more in {older} (one refused, then a call a partition); entries "
          f"{sum(entries.values())} of {total}, misplaced {misplaced}, written twice "
          f"{sum(c > 1 for c in entries.values())}; scored {len(scored)} distinct, twice "
          f"{twice}, never {total - len(scored)}")  # fmt: skip
    ok = (one_call == 1 and older == 1 + p and sum(entries.values()) == total and not misplaced
          and len(scored) == total and not twice)  # fmt: skip
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"kept {tmp} (worker.log)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
