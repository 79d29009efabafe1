"""The real `intentstream worker` process under load (`intentstream bench --latency`).

Three measurements on the bench's Redis, each on a flushed database:
  backlog   the preloaded events, timed from the first score entry's id time to the last's
            (Redis's clock), with Redis's and the worker's CPU per event over the run;
  latency   a producer in a process of its own XADDs at fixed rates (fractions of that
            backlog rate) while the worker keeps up; latency = the score entry's id time minus
            its event's entry id time (commit minus arrival, 1 ms resolution). Each row shows
            the rate the producer reached and the machine's 1-minute load average at its
            start, and a rate the producer fell short of is said under the table;
  memory    MEMORY USAGE of user states (against their fields' raw bytes) and of the event
            and score streams per entry, for --history-events and for 0.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import cycle
from multiprocessing.connection import Connection
from pathlib import Path

import hiredis
import numpy as np
import redis

from worker.bench.latency_phase import id_ms
from worker.bench.runs import process_cpu
from worker.bench.workload import SCORES, STREAM, preload, sampled_state_keys
from worker.engine.compute.lean_state import as_fields


def start_worker(
    url: str, model: Path, batch: int, history: int, log, layout: str = "full"
) -> subprocess.Popen:
    exe = shutil.which("intentstream") or str(Path(sys.executable).parent / "intentstream")
    cmd = [exe, "worker", "--redis-url", url, "--model", str(model), "--metrics-port", "0",
           "--consumer", "bench-load", "--block-ms", "100", "--batch-size", str(batch),
           "--retention-seconds", "0", "--history-events", str(history),
           "--scores-maxlen", "100000000",  # XLEN counts every score of the run
           "--layout", layout, "--log-format", "json"]  # fmt: skip
    return subprocess.Popen(cmd, stdout=log, stderr=log)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_for(condition, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise RuntimeError(f"the worker exited while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.01)


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def backlog(r: redis.Redis, proc: subprocess.Popen, n: int) -> tuple[float, float, float]:
    """(events/s from first score to last, Redis CPU µs/event, worker CPU µs/event); CPU
    from the first score on (start-up and kernel loading are not per-event costs)."""
    wait_for(lambda: r.xlen(SCORES) > 0, proc, 300, "the first score")
    cpu0, w0, done = redis_cpu(r), process_cpu([proc.pid]), r.xlen(SCORES)
    wait_for(lambda: r.xlen(SCORES) >= n, proc, 1800, "the backlog")
    cpu1, w1 = redis_cpu(r), process_cpu([proc.pid])
    counted = max(1, n - done)
    first = r.xrange(SCORES, count=1)[0][0]
    last = r.xrevrange(SCORES, count=1)[0][0]
    seconds = max(0.001, (id_ms(last) - id_ms(first)) / 1000)
    return n / seconds, (cpu1 - cpu0) / counted * 1e6, (w1 - w0) / counted * 1e6


CHUNKS = 256  # distinct pre-packed chunks the producer cycles through


def packed_chunks(users: list[str], chunk: int, count: int) -> list[bytes]:
    """`count` chunks of `chunk` XADDs of random users' events, each packed as RESP bytes
    before the clock starts: the producer then spends no Python per event on packing (with
    redis-py's pipeline, ~10 µs an event, it fell short of 75% of the worker's rate)."""
    rng = np.random.default_rng(3)
    types = ["view", "add_to_cart", "coupon", "view", "view"]
    out = []
    for _ in range(count):
        picks = rng.integers(0, len(users), chunk).tolist()
        out.append(b"".join(hiredis.pack_command(("XADD", STREAM, "*", "user_id", users[u],
                                                  "type", types[u % len(types)]))
                            for u in picks))  # fmt: skip
    return out


def produce(r: redis.Redis, users: list[str], rate: float, seconds: float) -> int:
    """XADD events at `rate` per second for `seconds` (chunks every 2 ms); how many."""
    chunk = max(1, round(rate / 500))
    chunks = packed_chunks(users, chunk, min(CHUNKS, max(1, round(rate * seconds / chunk))))
    conn = r.connection_pool.get_connection()
    sent, t0 = 0, time.monotonic()
    try:
        for packed in cycle(chunks):
            if time.monotonic() - t0 >= seconds:
                break
            conn.send_packed_command([packed])
            for _ in range(chunk):
                conn.read_response()  # an error reply raises: the run stops
            sent += chunk
            ahead = sent / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    except BaseException:
        conn.disconnect()  # replies may still be in flight on it
        raise
    finally:
        r.connection_pool.release(conn)
    return sent


def _producer_main(url: str, users: list[str], rate: float, seconds: float, out: Connection):
    """The producer process: XADD at `rate` for `seconds`; send back (events, seconds)."""
    r = redis.Redis.from_url(url)
    r.ping()  # connected before the clock starts
    t0 = time.monotonic()
    sent = produce(r, users, rate, seconds)
    out.send((sent, time.monotonic() - t0))
    out.close()


def produce_apart(url: str, users: list[str], rate: float, seconds: float) -> tuple[int, float]:
    """Run the producer in a process of its own (so its Python does not share this one's
    interpreter with anything); (events sent, seconds it took)."""
    ctx = multiprocessing.get_context("spawn")
    theirs, ours = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_producer_main, args=(url, users, rate, seconds, ours))
    child.start()
    ours.close()
    try:
        if not theirs.poll(seconds + 120):
            raise RuntimeError("the producer process did not report")
        sent, took = theirs.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
    return sent, took


def latency(
    r: redis.Redis, url: str, proc: subprocess.Popen, users: list[str], rate: float,
    seconds: float,
) -> tuple[float, np.ndarray]:  # fmt: skip
    """Produce at `rate` from a process of its own; (achieved rate, per-event latencies in
    ms)."""
    start = r.xinfo_stream(SCORES)["last-generated-id"]
    before = r.xlen(SCORES)
    sent, took = produce_apart(url, users, rate, seconds)
    achieved = sent / max(took, 1e-9)
    wait_for(lambda: r.xlen(SCORES) >= before + sent, proc, 120, "the producer's events")
    lat = [id_ms(sid) - id_ms(f[b"event_id"])
           for sid, f in r.xrange(SCORES, b"(" + start, "+")]  # fmt: skip
    return achieved, np.asarray(lat, np.float64)


REACHED = 0.95  # a producer rate below this share of its target is said under the table


def reached_note(short: list[float]) -> str:
    """The line under the latency table: which load levels' producer fell short of its rate
    (their latencies are then those of a lighter load)."""
    if not short:
        return f"(the producer reached every rate, >= {REACHED:.0%} of its target)\n"
    levels = ", ".join(f"{load:.0%}" for load in short)
    return (f"(the producer fell short of its rate at {levels}: below {REACHED:.0%} of the "
            "target, so those rows measure a lighter load; loadavg is the machine's 1-minute "
            "load average at the row's start)\n")  # fmt: skip


def memory(r: redis.Redis, sample: int = 500) -> dict[str, float]:
    """Bytes per user state (MEMORY USAGE, and its fields' raw bytes) and per stream entry."""
    keys = sampled_state_keys(r, sample)
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
        pipe.hgetall(key)
    replies = pipe.execute()
    usage = replies[0::2]
    raw = [sum(len(k) + len(v) for k, v in h.items()) for h in replies[1::2]]
    states = [as_fields(h) for h in replies[1::2]]  # the lean layout's read out
    h_bytes = [len(h.get(b"h", b"")) for h in states]
    recent = [len(h.get(b"recent", b"")) for h in states]
    out = {"state": float(np.mean(usage)), "raw": float(np.mean(raw)),
           "h": float(np.mean(h_bytes)), "recent": float(np.mean(recent)),
           "key": float(np.mean([len(k) for k in keys]))}  # fmt: skip
    for name, stream in (("event", STREAM), ("score", SCORES)):
        out[name] = (r.memory_usage(stream, samples=0) or 0) / max(1, r.xlen(stream))
    return out


def run_load_bench(
    r: redis.Redis, url: str, model: Path, events: list[dict], args, loads: list[float],
    f_rate: float | None,
) -> None:  # fmt: skip
    """Print the real process's backlog rate, latency table and memory figures."""
    users = list(dict.fromkeys(e["user_id"] for e in events))
    mem: dict[int, dict[str, float]] = {}
    with open(Path(model).parent / "worker-load.log", "ab") as log:
        for history in dict.fromkeys([args.history_events, 0]):
            preload(r, events, args.event_ids)
            proc = start_worker(url, model, args.batch_size, history, log, args.layout)
            try:
                rate, redis_us, worker_us = backlog(r, proc, len(events))
                mem[history] = memory(r)
                line = (f"real worker process, history-events {history}: {rate:,.0f} events/s "
                        f"(first score to last), Redis CPU {redis_us:.1f} µs/event, worker CPU "
                        f"{worker_us:.1f} µs/event")  # fmt: skip
                if f_rate:
                    line += f"; / f = {rate / f_rate:.2f}"
                print(line, flush=True)
                if history != args.history_events:
                    continue
                print(f"\nlatency under load (a producer at a fixed rate for "
                      f"{args.latency_seconds:.0f} s; entry id time to the score's "
                      "commit):")  # fmt: skip
                print(f"{'load':>6} {'target/s':>9} {'sent/s':>9} {'events':>8} "
                      f"{'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'loadavg':>7}")  # fmt: skip
                short = []
                for load in loads:
                    busy = os.getloadavg()[0]
                    achieved, lat = latency(r, url, proc, users, load * rate,
                                            args.latency_seconds)  # fmt: skip
                    print(f"{load:>6.0%} {load * rate:>9,.0f} {achieved:>9,.0f} {len(lat):>8} "
                          f"{np.percentile(lat, 50):>7.1f} {np.percentile(lat, 99):>7.1f} "
                          f"{lat.max():>7.1f} {busy:>7.2f}", flush=True)  # fmt: skip
                    if achieved < REACHED * load * rate:
                        short.append(load)
                print(reached_note(short))
            finally:
                stop(proc)
    print("memory (MEMORY USAGE, mean of 500 states; streams per entry):")
    for history, m in mem.items():
        print(f"  history-events {history:>2}: state {m['state']:.0f} B (fields' raw bytes "
              f"{m['raw']:.0f}, of which h {m['h']:.0f} and recent {m['recent']:.0f}; key "
              f"{m['key']:.0f}) = {m['state'] / m['raw']:.2f}x raw; retained event "
              f"{m['event']:.0f} B; score entry {m['score']:.0f} B")  # fmt: skip
