"""What the commit costs Redis (`intentstream bench --commit`): the worker's real commits of a
backlog, replayed against the bench's Redis, for each layout, beside a plain consumer's writes
of the same events.

The backlog goes once through the worker's pipeline without Redis (parse, states from the
write-through cache, `build_commit`; worker/bench/pipeline_cpu.py), and each commit is packed
for each layout (docs/contract.md, The lean layout). A round flushes Redis, publishes the
backlog, reads it all as the committing consumer (every entry pending, for the plain
consumer's XACKs), then sends the commits one by one: the checks under WATCH and the transaction
(adapters/commit.py; two round trips in a worker, one pipeline here, the same work for
Redis), each's replies read before the next, and counts Redis's CPU (`used_cpu_user` +
`used_cpu_sys`) over the sends only. `plain` sends, per batch, the writes of the plain
consumer of `--against-plain` as one pipeline: an HSET of h and last_id per user, an XADD of
user_id, score and event_id and an XACK per event. Nothing else runs while Redis works, so
the figures are steadier than a live worker's; the rounds rotate the variants' order.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import redis

from model.scoring import ScoringModel
from worker.bench.load import redis_cpu
from worker.bench.pipeline_cpu import entries_of, pipeline_commits
from worker.bench.workload import GROUP, KEYS, STREAM
from worker.common.connection import read_replies
from worker.engine.adapters.commit import CommitLimits, Committer
from worker.engine.adapters.resp import packed_command
from worker.engine.compute.pipeline import Commit

CONSUMER, HOLDER = "bench-commit", "bench-commit:0"
VARIANTS = ("full", "lean", "plain")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The commit bench's flag on the bench's parser."""
    p.add_argument("--commit", action="store_true",
                   help="run the commit bench instead of the variants: the worker's commits "
                   "of the backlog replayed for each layout beside a plain consumer's writes, "
                   "Redis CPU per event, alternated --repeat times")  # fmt: skip


def plain_writes(commit: Commit) -> tuple[bytes, int]:
    """The plain consumer's writes of a commit's events, as one pipeline's bytes, and the
    number of its commands."""
    keys = [KEYS.state(0, u) for u in commit.users]
    rows = np.ascontiguousarray(commit.h, "<f4").reshape(len(keys), -1)
    out = [packed_command(["HSET", k, "h", h.tobytes(), "last_id", lid], 5)
           for k, h, lid in zip(keys, rows, commit.last_ids, strict=True)]  # fmt: skip
    users = [commit.users[i] for i in commit.score_user.tolist()]
    for user, eid in zip(users, commit.score_event_ids, strict=True):
        out.append(packed_command(["XADD", KEYS.scores(0), "*", "user_id", user, "score", "0.0",
                                   "event_id", eid], 9))  # fmt: skip
    out += [packed_command(["XACK", STREAM, GROUP, ack], 4) for ack in commit.ack_ids]
    return b"".join(out), len(out)


def worker_commit(commit: Commit, committer: Committer) -> tuple[bytes, int]:
    """The worker's commit as one pipeline's bytes: the checks under WATCH, then the
    transaction; and the number of its replies (EXEC's last)."""
    checks, n_checks = committer.checks(commit)
    transaction, n = committer.transaction(commit)
    return b"".join([checks, *transaction]), n_checks + n


def _pending(r: redis.Redis, batches: list[list]) -> None:
    """A flushed database with the backlog published and read by CONSUMER (pending, for the
    plain consumer's XACKs; the worker's commits need only the stream), the partition's lease
    HOLDER's, its sequence where the first commit read it."""
    r.flushdb()
    pipe = r.pipeline(transaction=False)
    for entries in batches:
        for entry_id, flat in entries:
            pipe.execute_command("XADD", STREAM, entry_id, *flat)
    pipe.execute()
    r.xgroup_create(STREAM, GROUP, id="0")
    while r.xreadgroup(GROUP, CONSUMER, {STREAM: ">"}, count=10_000):
        pass
    r.set(KEYS.lease(0), HOLDER)
    r.set(KEYS.commit_seq(0), "1")


def replay_cpu(r: redis.Redis, batches: list[list], sends: list[tuple[bytes, int]]) -> float:
    """Redis CPU seconds of the sends one by one (bytes and their number of replies), each's
    replies read before the next; a commit (one reply) must apply."""
    _pending(r, batches)
    conn = r.connection_pool.get_connection()
    try:
        before = redis_cpu(r)
        for command, replies in sends:
            conn.send_packed_command([command])
            reply = read_replies(conn, replies)
            if reply[-1] is None or isinstance(reply[-1], redis.ResponseError):
                raise RuntimeError(f"a replayed commit did not apply: {reply[-1]!r}")
        return redis_cpu(r) - before
    finally:
        r.connection_pool.release(conn)


def run_commit_bench(
    r: redis.Redis, model: ScoringModel, events: list[dict], args: argparse.Namespace
) -> dict[str, list[float]]:
    """Print the commit's Redis CPU per event for each layout and the plain writes, per
    round and their medians; return µs/event per variant and round."""
    batches = entries_of(events, ())
    commits = list(pipeline_commits(model, batches, args.history_events))
    limits = CommitLimits(10**9, 10_000, 512, 0)
    sends = {
        lay: [worker_commit(c, Committer(r, KEYS, HOLDER, limits, lay))
              for c in commits]
        for lay in ("full", "lean")
    }  # fmt: skip
    sends["plain"] = [plain_writes(c) for c in commits]
    n = len(events)
    print(f"the worker's {len(commits)} commits of the backlog replayed (history-events "
          f"{args.history_events}), Redis CPU µs per event:")  # fmt: skip
    for name, commands in sends.items():
        print(f"  {name:<6} {sum(len(b) for b, _ in commands) / n:5.0f} bytes sent per event")
    cost: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for k in range(max(1, args.repeat)):
        line = []
        at = k % len(VARIANTS)
        for variant in VARIANTS[at:] + VARIANTS[:at]:
            cost[variant].append(replay_cpu(r, batches, sends[variant]) / n * 1e6)
            line.append(f"{variant} {cost[variant][-1]:.2f}")
        print(f"  round {k + 1}: " + ", ".join(line) + f"; load average {os.getloadavg()[0]:.2f}",
              flush=True)  # fmt: skip
    med = {v: float(np.median(x)) for v, x in cost.items()}
    ratio = {v: float(np.median(np.divide(cost[v], cost["full"]))) for v in VARIANTS[1:]}
    print(f"medians: full {med['full']:.2f}, lean {med['lean']:.2f}, plain writes "
          f"{med['plain']:.2f} µs/event; lean / full {ratio['lean']:.2f}, lean / plain "
          f"{float(np.median(np.divide(cost['lean'], cost['plain']))):.2f}, full / plain "
          f"{float(np.median(np.divide(cost['full'], cost['plain']))):.2f} (medians of each "
          "round's ratio)")  # fmt: skip
    return cost
