"""What the commit costs Redis (`intentstream bench --commit`): the worker's real commits of a
backlog, replayed against the bench's Redis, for each layout, beside a plain consumer's writes
of the same events.

The backlog goes once through the worker's pipeline without Redis (parse, states from the
write-through cache, `build_commit`; worker/bench/pipeline_cpu.py), and each commit is packed
for each layout (docs/contract.md, The lean layout). A round flushes Redis, publishes the
backlog, reads it all as the committing consumer (so every entry is pending, as the worker
leaves it), then sends the commits one by one, each EVALSHA's reply read before the next, and
counts Redis's CPU (`used_cpu_user` + `used_cpu_sys`) over the sends only. `plain` sends, per
batch, the writes of the plain consumer of `--against-plain` as one pipeline: an HSET of h and
last_id per user, an XADD of user_id, score and event_id and an XACK per event. Two probes
of where the script's cost goes, beside them: `multi` sends the full layout's checks and writes
without a script, as a WATCH-based commit would (WATCH of the lease and the sequence, the
script's check reads, then MULTI, the very writes the script makes, EXEC; one pipeline here,
two round trips in a worker, the same work for Redis); `args` sends the full layout's EVALSHA
to a script that returns at once (what reading the command and turning its arguments into Lua
strings costs). Nothing else runs while Redis works, so the figures are steadier than a live
worker's; the rounds rotate the variants' order.
"""

from __future__ import annotations

import argparse
import os

import hiredis
import numpy as np
import redis

from model.scoring import ScoringModel
from worker.bench.load import redis_cpu
from worker.bench.pipeline_cpu import entries_of, pipeline_commits
from worker.bench.workload import GROUP, KEYS, STREAM
from worker.engine.adapters.commit import (
    COMMIT_SCRIPT,
    CommitLimits,
    CommitScript,
    decimals,
    score_columns,
    state_columns,
)
from worker.engine.adapters.resp import as_arguments, packed_command
from worker.engine.compute.pipeline import Commit

CONSUMER, HOLDER = "bench-commit", "bench-commit:0"
VARIANTS = ("full", "lean", "plain", "multi", "args")
RETURN_AT_ONCE = "return {'ok', ''}"  # the `args` probe's script


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


def multi_writes(commit: Commit, script: CommitScript) -> tuple[bytes, int]:
    """The full layout's commit without a script, for a commit of the bench's kind (no shadow,
    rules, actions, dead letters or rewrites; no state TTL): WATCH, the script's check reads,
    then MULTI, its writes in its order and EXEC, as one pipeline's bytes, and the number of its
    replies."""
    c, keys = commit, script.pack(commit)[0]  # the script's KEYS
    events, scores_key, dead, lease, seq, acked, last_commit = keys[:7]
    text = decimals(c.scores)
    h, score, last_id, last_ts, n, recent, event_ids = map(
        as_arguments, state_columns(c, text, False, False)
    )
    first, last = c.ack_ids[0], c.ack_ids[-1]
    commands: list[list] = [
        ["WATCH", lease, seq], ["GET", lease],
        ["XPENDING", events, GROUP, first, first, 1, CONSUMER],
        ["XPENDING", events, GROUP, last, last, 1, CONSUMER], ["XPENDING", events, GROUP],
        ["GET", seq], ["TYPE", scores_key], ["TYPE", dead], ["GET", last_commit], ["MULTI"],
    ]  # fmt: skip
    for user, s, eid, type_, ts in zip(*map(as_arguments, score_columns(c, text, False)),
                                       strict=True):  # fmt: skip
        commands.append(["XADD", scores_key, "*", "user_id", user, "score", s, "event_id", eid,
                         "type", type_, "ts", ts, "model", c.model])  # fmt: skip
    commands += [
        ["XTRIM", scores_key, "MAXLEN", "~", script.limits.scores_maxlen],
        ["XACK", events, GROUP, *c.ack_ids], ["SET", acked, last],
        ["SET", last_commit, script.token(c)], ["INCR", seq],
    ]  # fmt: skip
    rows = zip(keys[8:], h, score, last_id, last_ts, n, recent, event_ids, strict=True)
    for key, h_row, s, lid, lts, count, rec, eids in rows:
        fields = ["h", h_row, "score", s, "last_id", lid, "last_ts", lts, "model", c.model,
                  "n", count, "recent", rec]  # fmt: skip
        commands.append(["HSET", key, *fields, *(["event_ids", eids] if eids else [])])
    commands.append(["EXEC"])
    return b"".join(hiredis.pack_command(tuple(x)) for x in commands), len(commands)


def _pending(r: redis.Redis, batches: list[list]) -> None:
    """A flushed database with the backlog published and read by CONSUMER, the partition's
    lease HOLDER's, its sequence where the first commit read it."""
    r.flushdb()
    r.script_load(COMMIT_SCRIPT)
    r.script_load(RETURN_AT_ONCE)
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
            reply = [conn.read_response() for _ in range(replies)]
            if replies == 1 and reply[0][0] != b"ok":
                raise RuntimeError(f"a replayed commit was refused: {reply[0]!r}")
            if reply[-1] is None:  # an EXEC whose WATCH saw a change
                raise RuntimeError("a replayed transaction was aborted")
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
    scripts = {lay: CommitScript(r, KEYS, GROUP, CONSUMER, HOLDER, limits, lay)
               for lay in ("full", "lean")}  # fmt: skip
    sends = {lay: [(s.command(c), 1) for c in commits] for lay, s in scripts.items()}
    sends["plain"] = [plain_writes(c) for c in commits]
    sends["multi"] = [multi_writes(c, scripts["full"]) for c in commits]
    at_once = redis.client.Script(r, RETURN_AT_ONCE).sha.encode()  # the same length as any sha1
    full_sha = scripts["full"].sha.encode()
    sends["args"] = [(b.replace(full_sha, at_once, 1), 1) for b, _ in sends["full"]]
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
    print(f"probes: the full layout's writes without a script (multi) {med['multi']:.2f} "
          f"µs/event, {ratio['multi']:.2f} of the script's; its arguments alone (args) "
          f"{med['args']:.2f}, {ratio['args']:.2f}")  # fmt: skip
    return cost
