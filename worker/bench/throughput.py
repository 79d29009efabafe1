"""End-to-end benchmark: the worker beside the consumers a user might write, in one run.

    intentstream bench [--redis-url URL] [--events 200000] [--users 50000] [--hidden 64]

With `--workers 1,2,4 [--partitions 8] [--cluster]` it runs the scaling benchmark instead
(worker/bench/scaling.py: real worker processes, CPU per event, fleet arithmetic); with
`--rules 3 [--rules-fire 0.9]` what intent rules cost the worker (worker/bench/rules.py); with
`--inputs` what declared inputs (product, category, brand, price) cost it (worker/bench/inputs.py);
with `--shadow` what a shadow model beside the current one costs it (worker/bench/shadow.py);
with `--against-plain` the real worker process against a plain redis-py consumer
(worker/bench/plain_consumer.py).

Each variant gets the same preloaded backlog on a flushed database and consumes it to the
end. Variants:
  a  worker         this project's worker (pipelined read, commit in MULTI/EXEC, batched kernel)
  b  worker, no model   the same with the model step replaced by zeros (its I/O path)
  c  redis-py       XREADGROUP, then pipelines of HGET, HSET, XADD, XACK per event; no model
  d  naive          one round trip per command per event, numpy reference step per event
  e  torch          pipelines as in c, PyTorch nn.RNNCell stepped per event (if installed)
  f  competent      redis-py as a competent user writes it, with exactly the worker's outputs
                    (users deduplicated per batch, one pipeline of HMGETs, one pipeline of an
                    HSET per user with every state field + an XADD per event + XACK); no model
The slow variants (d, e) run on the first --subset events. Latency is per event, from the
start of its batch's read to the end of its batch's commit (the backlog's queueing time is
not counted: every variant starts with the whole backlog waiting).

Redis CPU per event: `used_cpu_user` + `used_cpu_sys` (INFO cpu) over the variant's run, and
INFO commandstats (reset before each variant; commands run by a script or a transaction are
counted inside its EVALSHA or EXEC and again under their own names). `--latency` adds the
real worker process under a fixed-rate producer and the memory per state and per retained
event (worker/bench/load.py).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np
import redis

from model.artifact import Model, save_model, state_shape
from model.benchmarks.kernels import machine_line
from model.data.synthetic import EVENT_TYPES, LABEL_TYPE, synthetic_events
from model.random_init import random_model
from model.reference import reference_step
from model.scoring import ScoringModel
from worker.bench.commit_cost import add_arguments as add_commit_arguments
from worker.bench.commit_cost import run_commit_bench
from worker.bench.inprocess import consume, start_worker
from worker.bench.inputs import add_arguments as add_inputs_arguments
from worker.bench.inputs import run_inputs_bench
from worker.bench.load import run_load_bench
from worker.bench.plain_consumer import add_arguments as add_plain_arguments
from worker.bench.plain_consumer import run_against_plain
from worker.bench.rules import add_arguments as add_rules_arguments
from worker.bench.rules import run_rules_bench
from worker.bench.scaling import main as scaling_main
from worker.bench.shadow import add_arguments as add_shadow_arguments
from worker.bench.shadow import run_shadow_bench
from worker.bench.workload import GROUP, SCORES, STATE, STREAM, preload
from worker.common.cli_help import HelpFormatter
from worker.common.connection import connect
from worker.common.dedup import DEFAULT_WINDOW, DEFAULT_WINDOW_SECONDS, packed_times, parse_times
from worker.common.local_redis import LocalRedis
from worker.common.settings import DEFAULT_BATCH_SIZE
from worker.engine.compute.recent import extended, pack, unpack
from worker.lifecycle.model_source import FileModelSource


class Result:
    """Throughput and latency of one variant."""

    def __init__(self, name: str, events: int, seconds: float, latencies: list[tuple[int, float]]):
        self.name = name
        self.events = events
        self.seconds = seconds
        counts = np.array([n for n, _ in latencies])
        values = np.array([v for _, v in latencies])
        per_event = np.repeat(values, counts) if len(values) else np.zeros(1)
        self.p50 = float(np.percentile(per_event, 50))
        self.p99 = float(np.percentile(per_event, 99))

    @property
    def rate(self) -> float:
        return self.events / self.seconds


class RedisCost:
    """Redis's CPU and per-command time over one variant's run."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        r.config_resetstat()
        self.cpu0 = self._cpu()

    def _cpu(self) -> float:
        info = self.r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def stop(self, events: int) -> None:
        """Per-event figures: CPU µs, and µs per command (calls inside scripts included)."""
        self.cpu_us = (self._cpu() - self.cpu0) / events * 1e6
        stats = self.r.info("commandstats")
        self.commands = {name.removeprefix("cmdstat_"): v["usec"] / events
                         for name, v in stats.items() if v["usec"] / events >= 0.05}  # fmt: skip

    def top(self, k: int = 6) -> str:
        best = sorted(self.commands.items(), key=lambda kv: -kv[1])[:k]
        return ", ".join(f"{name} {us:.1f}" for name, us in best)


def run_worker(
    url: str, model_path: Path, n: int, batch: int, no_model: bool, history_events: int = 32
) -> tuple[float, list]:
    """The in-process worker over n events: (seconds, per-tick (events, seconds))."""
    return consume(*start_worker(url, model_path, batch, no_model, history_events), n)


def _read_batch(r: redis.Redis, batch: int):
    reply = r.xreadgroup(GROUP, "bench", {STREAM: ">"}, count=batch)
    return reply[0][1] if reply else []


def run_pipelined(r: redis.Redis, n: int, batch: int, step: Callable | None) -> tuple[float, list]:
    """Variant c (step None) and e: what a user would write with redis-py's pipelines."""
    done, latencies = 0, []
    t0 = time.perf_counter()
    while done < n:
        t = time.perf_counter()
        entries = _read_batch(r, batch)
        pipe = r.pipeline(transaction=False)
        for _, f in entries:
            pipe.hget(f"{STATE}{f[b'user_id'].decode()}", "h")
        states = pipe.execute()
        for (eid, f), h in zip(entries, states, strict=True):
            user = f[b"user_id"].decode()
            h_new, score = step(h, f[b"type"].decode()) if step else (h or b"", 0.0)
            pipe.hset(f"{STATE}{user}", mapping={"h": h_new, "last_id": eid})
            pipe.xadd(SCORES, {"user_id": user, "score": score, "event_id": eid})
            pipe.xack(STREAM, GROUP, eid)
        pipe.execute()
        done += len(entries)
        latencies.append((len(entries), time.perf_counter() - t))
    return time.perf_counter() - t0, latencies


def _memory_after(stored: bytes, new: list[tuple[bytes, int]]) -> bytes:
    """The competent consumer's resend memory, as the worker packs it (common/dedup.py): the
    own ids of the last day, at most DEFAULT_WINDOW, with their entry times; no check."""
    old, _, rest = stored.partition(b"\n")
    ids = old.split()
    times = parse_times(rest.partition(b"\n")[2], len(ids)) or [new[0][1] if new else 0] * len(ids)
    ids += [i for i, _ in new]
    times += [t for _, t in new]
    keep = (
        [k for k, t in enumerate(times) if t >= times[-1] - DEFAULT_WINDOW_SECONDS] if ids else []
    )
    keep = keep[-DEFAULT_WINDOW:]
    if not keep:
        return b""
    return b" ".join(ids[k] for k in keep) + b"\n\n" + packed_times([times[k] for k in keep])


def run_competent(
    r: redis.Redis, n: int, batch: int, model: Model, version: str, history: int
) -> tuple[float, list]:
    """Variant f: a competent redis-py consumer writing exactly the worker's outputs (every
    state field, every score entry field; states pass through, every score is 0): users
    deduplicated per batch, one pipeline of HMGETs, one pipeline of HSETs, XADDs, XACK."""
    gap_ms = model.meta.session_gap_seconds * 1000.0
    zero_h = bytes(4 * int(np.prod(state_shape(model.meta))))  # an LSTM's: h and c
    done, latencies = 0, []
    t0 = time.perf_counter()
    while done < n:
        t = time.perf_counter()
        entries = _read_batch(r, batch)
        by_user: dict[str, list] = {}
        for eid, f in entries:
            ts = int(f[b"ts"]) if b"ts" in f else int(eid.split(b"-")[0])
            event = (eid, f[b"type"].decode(), ts, f.get(b"event_id"))
            by_user.setdefault(f[b"user_id"].decode(), []).append(event)
        pipe = r.pipeline(transaction=False)
        for user in by_user:
            pipe.hmget(f"{STATE}{user}", "h", "n", "recent", "event_ids")
        for (user, evs), (h, count, raw, ids) in zip(by_user.items(), pipe.execute(), strict=True):
            recent = extended(unpack(raw), [e[2] for e in evs], [e[1] for e in evs],
                              history, gap_ms)  # fmt: skip
            memory = _memory_after(ids or b"", [(e[3], int(e[0].split(b"-")[0]) // 1000)
                                                for e in evs if e[3]])  # fmt: skip
            fields = {"h": h or zero_h, "score": "0", "last_id": evs[-1][0],
                      "last_ts": evs[-1][2], "model": version, "n": int(count or 0) + len(evs),
                      "recent": pack(recent) if history else b""}  # fmt: skip
            if memory:  # as the worker: no field without producer ids
                fields["event_ids"] = memory
            pipe.hset(f"{STATE}{user}", mapping=fields)
        for eid, f in entries:
            ts = f[b"ts"] if b"ts" in f else eid.split(b"-")[0]
            pipe.xadd(SCORES, {"user_id": f[b"user_id"], "score": "0",
                      "event_id": f.get(b"event_id") or eid, "type": f[b"type"], "ts": ts,
                      "model": version}, maxlen=1_000_000, approximate=True)  # fmt: skip
        if entries:
            pipe.xack(STREAM, GROUP, *(eid for eid, _ in entries))
        pipe.execute()
        done += len(entries)
        latencies.append((len(entries), time.perf_counter() - t))
    return time.perf_counter() - t0, latencies


def run_naive(r: redis.Redis, model: Model, n: int, batch: int) -> tuple[float, list]:
    """Variant d: one round trip per command per event, numpy reference step per event."""
    index = {t: i for i, t in enumerate(model.meta.event_types)}
    unknown, shape = len(index), state_shape(model.meta)
    feats = np.zeros(len(model.meta.features))
    done, latencies = 0, []
    t0 = time.perf_counter()
    while done < n:
        t = time.perf_counter()
        entries = _read_batch(r, batch)
        for eid, f in entries:
            key = f"{STATE}{f[b'user_id'].decode()}"
            raw = r.hget(key, "h")
            h = np.frombuffer(raw, "<f8").reshape(shape) if raw else np.zeros(shape)
            h, score = reference_step(
                model.arrays, h, index.get(f[b"type"].decode(), unknown), feats, model.meta.head
            )
            r.hset(key, mapping={"h": h.tobytes(), "last_id": eid})
            r.xadd(
                SCORES,
                {"user_id": f[b"user_id"], "score": score, "event_id": eid},
            )
            r.xack(STREAM, GROUP, eid)
        done += len(entries)
        latencies.append((len(entries), time.perf_counter() - t))
    return time.perf_counter() - t0, latencies


def torch_step(model: Model) -> Callable | None:
    """A per-event step with PyTorch's nn.RNNCell, or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)
    a, H = model.arrays, model.meta.hidden
    cell = torch.nn.RNNCell(a["layer0.W_xh"].shape[0], H)
    with torch.no_grad():
        cell.weight_ih.copy_(torch.tensor(a["layer0.W_xh"]).T)
        cell.weight_hh.copy_(torch.tensor(a["layer0.W_hh"]).T)
        cell.bias_ih.copy_(torch.tensor(a["layer0.b_h"]))
        cell.bias_hh.zero_()
    emb = torch.tensor(a["embedding"], dtype=torch.float32)
    w_q = torch.tensor(a["head.W_hq"], dtype=torch.float32)
    index = {t: i for i, t in enumerate(model.meta.event_types)}
    F = len(model.meta.features)

    def step(raw: bytes | None, type_: str) -> tuple[bytes, float]:
        with torch.inference_mode():
            h = (
                torch.frombuffer(bytearray(raw), dtype=torch.float32).view(1, H)
                if raw
                else torch.zeros(1, H)
            )
            x = torch.cat([emb[index.get(type_, len(index))], torch.zeros(F)]).view(1, -1)
            h = cell(x, h)
            score = float(torch.sigmoid(h @ w_q + float(a["head.b_q"][0])))
        return h.numpy().tobytes(), score

    return step


def median_result(runs: list[tuple[Result, RedisCost]]) -> tuple[Result, RedisCost]:
    """The repeat with the median rate (its latency and Redis figures go with it)."""
    ordered = sorted(runs, key=lambda rc: rc[0].rate)
    return ordered[len(ordered) // 2]


def print_table(results: dict[str, list[tuple[Result, RedisCost]]]) -> None:
    print(f"{'variant':<26} {'events':>8} {'events/s':>10} {'p50 ms':>8} {'p99 ms':>8}", end="")
    print(f" {'a / x':>7} {'redis µs/ev':>11}  runs (events/s)")
    a = median_result(results["a"])[0] if "a" in results else None
    for runs in results.values():
        res, cost = median_result(runs)
        ratio = f"{a.rate / res.rate:7.2f}" if a else "      -"
        print(f"{res.name:<26} {res.events:>8} {res.rate:>10,.0f}", end="")
        print(f" {res.p50 * 1e3:>8.2f} {res.p99 * 1e3:>8.2f} {ratio} {cost.cpu_us:>11.1f}", end="")
        print("  " + " ".join(f"{r.rate:,.0f}" for r, _ in runs))
    print("\nRedis time per event by command, µs (median run; calls inside a script or a")
    print("transaction are also counted in its evalsha or exec):")
    for runs in results.values():
        res, cost = median_result(runs)
        print(f"  {res.name:<24} {cost.top()}")
    ratios = [("a / f (worker / competent consumer)", "a", "f", "2.0"),
              ("a / b (model on / I/O path)", "a", "b", "0.9")]  # fmt: skip
    for label, x, y, goal in ratios:
        if x in results and y in results and len(results[x]) == len(results[y]):
            same = sorted(rx.rate / ry.rate for (rx, _), (ry, _) in
                          zip(results[x], results[y], strict=True))  # fmt: skip
            print(f"{label}: {np.median(same):.2f} median of same-repeat ratios "
                  f"({', '.join(f'{v:.2f}' for v in same)}); goal >= {goal}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every variant and print the table (or the scaling benchmark, see above)."""
    if any(a == "--workers" or a.startswith("--workers=") for a in argv or []):
        return scaling_main(argv)
    p = argparse.ArgumentParser(
        prog="intentstream bench",
        description=__doc__.split("\n")[0],
        formatter_class=HelpFormatter,
        epilog="With --workers N,M,...: the scaling benchmark instead, real worker processes "
        "on a private Redis or a local cluster (--workers, --partitions, --cluster, "
        "--blas-threads, --latency-load; `intentstream bench --workers 1 --help` lists them).",
    )
    p.add_argument(
        "--redis-url", default=None, help="use this Redis (it is FLUSHED); default: a private one"
    )
    p.add_argument("--events", type=int, default=200_000, help="backlog size")
    p.add_argument("--users", type=int, default=50_000, help="distinct users in the backlog")
    p.add_argument("--hidden", type=int, default=64, help="hidden units of the random model")
    p.add_argument("--cell", choices=["rnn", "gru", "lstm"], default="rnn", help="the model's cell")
    p.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE,
                   help="entries per read (the worker's default)")  # fmt: skip
    p.add_argument("--subset", type=int, default=20_000, help="events for the slow variants d, e")
    p.add_argument("--variants", default="afbcde", help="run in this order, each repeat")
    p.add_argument("--repeat", type=int, default=1, help="rounds over the variants (medians)")
    p.add_argument("--history-events", type=int, default=32, help="as the worker's setting")
    p.add_argument("--no-event-ids", dest="event_ids", action="store_false",
                   help="publish the backlog without producer event ids (as before they "
                   "existed: the workload of older versions' bench)")  # fmt: skip
    p.add_argument("--latency", action="store_true",
                   help="also the real worker process: backlog rate, latency under a fixed-rate "
                   "producer at --loads of it, memory per state and per event")  # fmt: skip
    p.add_argument("--loads", default="0.5,0.9", help="producer rates, fractions of the max")
    p.add_argument("--latency-seconds", type=float, default=10.0, help="each --loads rate's run")
    p.add_argument(
        "--layout",
        choices=["full", "lean"],
        default="full",
        help="the real worker process's --layout (--against-plain, --latency)",
    )
    p.add_argument("--hash-max-listpack-value", type=int, default=None,
                   help="CONFIG SET on the bench's Redis first (states with h above 64 bytes are "
                   "hashtables at Redis's default)")  # fmt: skip
    add_rules_arguments(p)  # --rules N: what intent rules cost (worker/bench/rules.py)
    add_shadow_arguments(p)  # --shadow: what a shadow model costs (worker/bench/shadow.py)
    add_inputs_arguments(p)  # --inputs: what declared inputs cost (worker/bench/inputs.py)
    add_plain_arguments(p)  # --against-plain: the worker process / a plain consumer
    add_commit_arguments(p)  # --commit: the commit's Redis CPU, each layout
    args = p.parse_args(argv)

    server = None if args.redis_url else LocalRedis().start()
    url = args.redis_url or server.url
    r = connect(url, socket_timeout=30)
    # Redis 7 calls it listpack; before 7 (or an alias) ziplist
    options = r.config_get("hash-max-*-value")
    option = "hash-max-listpack-value" if "hash-max-listpack-value" in options else None
    option = option or next(iter(options), "hash-max-ziplist-value")
    if args.hash_max_listpack_value is not None:
        r.config_set(option, args.hash_max_listpack_value)
    try:
        with TemporaryDirectory() as tmp:
            model = random_model([*EVENT_TYPES, LABEL_TYPE], hidden=args.hidden, seed=0,
                                 cell=args.cell)  # fmt: skip
            model_path = Path(tmp) / "bench.npz"
            save_model(model, model_path)
            version = FileModelSource(model_path).current.version
            events = list(synthetic_events(args.events, args.users, seed=1))
            subset = events[: args.subset]
            print(f"machine: {machine_line()}, load average {os.getloadavg()[0]:.2f} at start")
            listpack = r.config_get(option).get(option, "?")
            print(f"redis: {r.info('server')['redis_version']} at {url}, "
                  f"{option} {listpack}")  # fmt: skip
            print(
                f"{len(events)} events, {args.users} users, {args.cell} H = {args.hidden}, ", end=""
            )
            print(f"batch {args.batch_size}, history-events {args.history_events}\n")
            b, hist = args.batch_size, args.history_events
            runs = {
                "a": ("a worker", events,
                      lambda n: run_worker(url, model_path, n, b, False, hist)),
                "b": ("b worker, no model", events,
                      lambda n: run_worker(url, model_path, n, b, True, hist)),
                "c": ("c redis-py pipelines", events, lambda n: run_pipelined(r, n, b, None)),
                "d": ("d naive + numpy", subset, lambda n: run_naive(r, model, n, b)),
                "f": ("f competent redis-py", events,
                      lambda n: run_competent(r, n, b, model, version, hist)),
            }  # fmt: skip
            # Warm-up (not reported): the first variant of a run otherwise pays for a cold
            # Redis allocator and CPU caches, and measured 20% slower in whatever position.
            preload(r, events[: min(len(events), 20_000)], args.event_ids)
            run_worker(url, model_path, min(len(events), 20_000), b, False, hist)
            if args.rules:
                run_rules_bench(r, url, model_path, events, args)
                return 0
            if args.shadow:
                run_shadow_bench(r, url, model_path, events, args, Path(tmp))
                return 0
            if args.inputs:
                run_inputs_bench(r, url, events, args, Path(tmp))
                return 0
            if args.against_plain:
                run_against_plain(r, url, model_path, events, args)
                return 0
            if args.commit:
                scoring = ScoringModel(model, version)
                scoring.warm_up()
                run_commit_bench(r, scoring, events, args)
                return 0
            step = torch_step(model) if args.cell == "rnn" else None  # e: nn.RNNCell
            if step is not None:
                runs["e"] = ("e torch RNNCell", subset, lambda n: run_pipelined(r, n, b, step))
            results: dict[str, list[tuple[Result, RedisCost]]] = {}
            for k in range(args.repeat):
                # later repeats rotate the order, so no variant always runs first
                shift = k % max(1, len(args.variants))
                order = args.variants[shift:] + args.variants[:shift]
                for key in order:
                    if key not in runs:
                        continue
                    name, data, run = runs[key]
                    preload(r, data, args.event_ids)
                    cost = RedisCost(r)
                    seconds, latencies = run(len(data))
                    cost.stop(len(data))
                    res = Result(name, len(data), seconds, latencies)
                    results.setdefault(key, []).append((res, cost))
                    print(f"  {name:<24} {res.rate:>10,.0f} ev/s  redis {cost.cpu_us:5.1f} µs/ev",
                          flush=True)  # fmt: skip
            if results:
                print()
                print_table({k: results[k] for k in args.variants if k in results})
            if args.latency:
                print()
                loads = [float(x) for x in args.loads.split(",") if x.strip()]
                f_rate = median_result(results["f"])[0].rate if "f" in results else None
                run_load_bench(r, url, model_path, events, args, loads, f_rate)
    finally:
        r.close()
        if server:
            server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
