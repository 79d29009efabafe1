"""At low traffic a node's partitions commit together (engine/adapters/together.py): every
commit's checks go out before any transaction, and each commit's checks stay its own. On one
Redis the batches are built as one (compute/joint.py) and their commits go in one
transaction on one connection, all or none: a refused one withholds the others, each sent
again alone; a lost reply leaves them all unsettled, each counted once Redis shows it
applied; what they count is what the batches count alone. On a cluster each has a
connection of its own: a refused or lost one leaves the others applied once. Both ways run
here on one Redis."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import redis

from model.data.synthetic import synthetic_events
from tests.consumers import in_process_consumer
from tests.test_worker import offline_scores
from tests.workers import score_entries, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.engine.adapters.commit import CommitRefusedError, CommitResult
from worker.engine.adapters.together import WITHHELD
from worker.producers.publisher import publish

pytestmark = pytest.mark.integration

P = 8
KEYS = Keys()


def one_event_per_partition() -> list[dict]:
    """A view by a user of each partition."""
    users: dict[int, str] = {}
    i = 0
    while len(users) < P:
        users.setdefault(partition_of(f"u{i}", P), f"u{i}")
        i += 1
    return [{"user_id": u, "type": "view", "event_id": f"e{p}"} for p, u in users.items()]


def assert_scored_once_as_offline(r, events: list[dict], model_path: Path) -> None:
    rows = score_entries(r, partitions=P)
    assert sorted(row["event_id"] for row in rows) == sorted(e["event_id"] for e in events)
    by_id = {row["event_id"]: float(row["score"]) for row in rows}
    want = offline_scores(model_path, events)
    np.testing.assert_allclose([by_id[e["event_id"]] for e in events], want, atol=1e-5)


def monitored(port: int, out: Path) -> subprocess.Popen:
    """redis-cli MONITOR into `out`, once it is listening (its OK written)."""
    proc = subprocess.Popen(["redis-cli", "-p", str(port), "monitor"], stdout=out.open("w"))
    wait_for(lambda: out.read_text().startswith("OK"), what="MONITOR")
    return proc


def logged(log, *names: str) -> list[tuple[int, str]]:
    """(line, command) of the MONITOR lines of these commands, in order."""
    lines = log.read_text().splitlines()
    return [
        (i, n) for i, x in enumerate(lines) for n in names if f'"{n}"' in x.split("]", 1)[-1][:12]
    ]


@pytest.mark.parametrize("one_transaction", [True, False])
def test_a_rounds_partitions_send_every_check_before_any_transaction(
    redis_server, model_path, tmp_path, one_transaction
):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, partitions=P)
    consumer.together.one_transaction = one_transaction  # False: as on a cluster
    consumer.tick()  # takes the leases; nothing to read
    assert sorted(consumer.ownership.owned) == list(range(P))
    judged, verdict = [], consumer.committer.verdict

    def spied(c, replies):  # on one Redis, a share is judged before its rest is made
        judged.append(getattr(c, "deferring", False))
        return verdict(c, replies)

    consumer.committer.verdict = spied
    events = one_event_per_partition()
    publish(r, events, partitions=P)
    log = tmp_path / "monitor.txt"
    monitor = monitored(redis_server.port, log)
    try:
        consumer.tick()
        # each commit's INCR of its sequence, the last write of its transaction
        wait_for(lambda: log.read_text().count('"INCR"') >= P, what="every commit's writes")
    finally:
        monitor.terminate()
        monitor.wait()
    lines = log.read_text().splitlines()
    watches = [i for i, x in enumerate(lines) if '"WATCH"' in x]
    execs = [i for i, x in enumerate(lines) if '"EXEC"' in x]
    assert len(watches) == P and len(execs) == (1 if one_transaction else P)
    assert max(watches) < min(execs), "a transaction went before every check was sent"
    # the client (address) of each command: one connection for all, else one per commit
    clients = {x.split("]")[0].split()[-1] for x in lines if '"WATCH"' in x or '"EXEC"' in x}
    assert len(clients) == (1 if one_transaction else P)
    assert consumer.metrics.count("scored") == P
    assert judged == [one_transaction] * P
    assert_scored_once_as_offline(r, events, model_path)
    consumer.close()


@pytest.mark.parametrize("one_transaction", [True, False])
def test_a_refused_or_lost_commit_among_them_leaves_the_others_applied_once(
    redis_server, model_path, one_transaction
):
    """Of one round's commits sent together: one meets a conflict (another writer moved its
    sequence on), one a lease taken by another, one loses its reply after applying. On a
    cluster the others apply and count once; on one Redis (built as one) they are withheld
    and each sent again alone. The conflicting one is computed and sent again, the lost one
    counted when Redis shows it applied, the taken one scored once its lease is back. On one
    Redis the checks go with the states' reads (adapters/early_checks.py), so the lease is
    taken before the round reads: a sequence moved after the read is the next test's."""
    r = connect(redis_server.url)
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(400, 60, seed=5))]
    publish(r, events, partitions=P)
    consumer = in_process_consumer(redis_server.url, model_path, partitions=P, lease_ms=1000)
    consumer.together.one_transaction = one_transaction  # False: as on a cluster
    commit_together, settled = consumer.together.commit, consumer.committer.settled
    commit_steps = consumer.together.commit_steps  # a cluster's: steps between nodes' sends
    outcomes: dict[int, object] = {}
    lost: list[int] = []

    def meddle() -> None:
        r.incr(KEYS.commit_seq(2))  # another writer's commit
        r.set(KEYS.lease(5), "another-worker")

    def first_round_meddled(client, commits, *whole):
        if outcomes:
            return commit_together(client, commits, *whole)
        if not one_transaction:
            meddle()
        got = commit_together(client, commits, *whole)
        outcomes.update({c.partition: o for (c, _), o in zip(commits, got, strict=True)})
        return got

    def first_round_meddled_steps(client, commits, *pack):
        if outcomes:
            return (yield from commit_steps(client, commits, *pack))
        meddle()
        got = yield from commit_steps(client, commits, *pack)
        outcomes.update({c.partition: o for (c, _), o in zip(commits, got, strict=True)})
        return got

    def reply_lost_once(conn, commit, prepared, replies):
        result = settled(conn, commit, prepared, replies)
        if commit.partition == 6 and not lost:
            lost.append(6)
            raise redis.ConnectionError("reply lost")
        return result

    read_states_steps = consumer.together.read_states_steps

    def first_round_meddled_reads(client, batches, *spec):
        if not outcomes:  # the checks go with these reads on one Redis
            r.set(KEYS.lease(5), "another-worker")
        return (yield from read_states_steps(client, batches, *spec))

    if one_transaction:
        consumer.together.read_states_steps = first_round_meddled_reads
    else:
        consumer.together.commit_steps = first_round_meddled_steps
    consumer.together.commit = first_round_meddled
    consumer.committer.settled = reply_lost_once

    def tick() -> bool:
        try:
            consumer.tick()
        except redis.ConnectionError as exc:
            consumer.recover(exc)  # what run() does
        if outcomes and r.get(KEYS.lease(5)) == b"another-worker":
            r.delete(KEYS.lease(5))  # it leaves: taken again at the next renewal
        return consumer.metrics.count("scored") >= len(events)

    wait_for(tick, what="every event scored")
    assert sorted(outcomes) == list(range(P))  # all eight went together
    assert outcomes[5].reason == "not_owned"
    others = {0, 1, 3, 4, 6, 7}
    if one_transaction:  # built as one: all or none
        assert all(outcomes[p] is WITHHELD for p in others | {2})
    else:
        assert outcomes[2].reason == "conflict"
        assert isinstance(outcomes[6], redis.ConnectionError)
        assert all(isinstance(outcomes[p], CommitResult) for p in others - {6})
    assert lost == [6]
    assert consumer.metrics.count("scored") == len(events)
    assert consumer.metrics.count("duplicate") == 0
    assert_scored_once_as_offline(r, events, model_path)
    consumer.close()


def test_a_commit_landing_between_the_early_checks_and_the_transaction_refuses_the_round(
    redis_server, model_path, tmp_path
):
    """On one Redis a round's checks go with its states' reads (adapters/early_checks.py),
    under WATCH; another writer's commit landing while the batches are built moves a watched
    sequence, so EXEC applies none of them (each a conflict), and each is computed again and
    scored once, as offline scoring gives it. The round's commits took two round trips:
    its reads with the checks, then the transaction (no checks sent again)."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, partitions=P)
    consumer.tick()  # takes the leases; nothing to read
    events = one_event_per_partition()
    publish(r, events, partitions=P)
    commit_together, outcomes = consumer.together.commit, []

    def moved_while_built(client, commits, *whole):
        if not outcomes:
            r.incr(KEYS.commit_seq(3))  # another writer's commit (INCRBY), after the reads
        got = commit_together(client, commits, *whole)
        outcomes.append(got)
        return got

    consumer.together.commit = moved_while_built
    log = tmp_path / "monitor.txt"
    monitor = monitored(redis_server.port, log)
    try:
        wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= P,
                 what="every event scored")  # fmt: skip
        wait_for(lambda: log.read_text().count('"INCR"') >= P, what="the writes logged")
    finally:
        monitor.terminate()
        monitor.wait()
    first = outcomes[0]
    assert len(first) == P and all(o.reason == "conflict" for o in first)
    lines = log.read_text().splitlines()
    watches = [i for i, x in enumerate(lines) if '"WATCH"' in x]
    hmgets = [i for i, x in enumerate(lines) if '"HMGET"' in x]
    execs = [i for i, x in enumerate(lines) if '"EXEC"' in x]
    # the first round: every WATCH before its reads, no checks between them and EXEC
    assert len([w for w in watches if w < execs[0]]) == P
    assert max(w for w in watches if w < execs[0]) < min(hmgets) < execs[0]
    assert consumer.metrics.value("intentstream_commit_retries_total", reason="conflict") >= P
    assert consumer.metrics.count("scored") == P
    assert_scored_once_as_offline(r, events, model_path)
    consumer.close()


def counted(consumer) -> dict[tuple, float]:
    """The worker's counters of what applied: outcomes, labelled sessions, resends
    forgotten early, unknown types, state resets (0 left out)."""
    names = ("intentstream_events_total", "intentstream_labelled_sessions_total",
             "intentstream_resend_window_overflow_total", "intentstream_unknown_type_events_total",
             "intentstream_state_resets_total")  # fmt: skip
    out = {}
    for metric in consumer.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name in names and sample.value:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def add_unstamped(r, events: list[dict], keys: Keys) -> None:
    """XADD each event to its user's partition as a producer without publish()'s stamps
    would: resends are known by their event_id alone, which the bound may forget."""
    pipe = r.pipeline(transaction=False)
    for e in events:
        fields = {k: str(v) for k, v in e.items()}
        pipe.xadd(keys.events(partition_of(e["user_id"], P)), fields)  # type: ignore[arg-type]
    pipe.execute()


def test_a_round_built_as_one_counts_what_its_batches_count_alone(redis_server, model_path):
    """The same events under two prefixes: one worker builds each round's batches as one
    (with a refusal that withholds a group and a lost reply that leaves one unsettled), the
    other builds and sends every batch alone. Their scores and every count are the same:
    the group's sums (labelled sessions, resends forgotten early) counted once."""
    r = connect(redis_server.url)
    events = [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(600, 40, seed=8))]
    rounds = [events[i : i + 60] for i in range(0, len(events), 60)]
    rounds[3] = rounds[3] + rounds[1][:20]  # a producer's resends
    workers = {}
    for prefix in ("joint", "alone"):
        workers[prefix] = in_process_consumer(redis_server.url, model_path, partitions=P,
                                              prefix=prefix, event_id_window=2)  # fmt: skip
    workers["alone"]._low_traffic = list  # every batch built and sent alone
    joint = workers["joint"]
    commit_together, settled = joint.together.commit, joint.committer.settled
    meddled: list[str] = []

    def refused_then_lost(client, commits, *whole):
        if not meddled:
            meddled.append("refused")
            r.incr(Keys("joint").commit_seq(commits[-1][0].partition))  # another writer
        return commit_together(client, commits, *whole)

    def reply_lost(conn, commit, prepared, replies):
        result = settled(conn, commit, prepared, replies)
        if meddled == ["refused"]:
            meddled.append("lost")
            raise redis.ConnectionError("reply lost")
        return result

    joint.together.commit = refused_then_lost
    joint.committer.settled = reply_lost
    sent = 0
    for batch in rounds:
        sent += len(batch)
        for prefix, consumer in workers.items():
            add_unstamped(r, batch, Keys(prefix))

            def tick(consumer=consumer, sent=sent) -> bool:
                try:
                    consumer.tick()
                except redis.ConnectionError as exc:
                    consumer.recover(exc)
                applied = sum(consumer.metrics.count(o) for o in ("scored", "duplicate"))
                return applied >= sent

            wait_for(tick, what=f"the round scored by {prefix}")
    assert meddled == ["refused", "lost"]
    assert counted(joint) == counted(workers["alone"])
    assert joint.metrics.count("duplicate") >= 1  # most resends: forgotten early (a bound of 2)
    assert any(k[0] == "intentstream_labelled_sessions_total" for k in counted(joint))
    assert any(k[0] == "intentstream_resend_window_overflow_total" for k in counted(joint))
    scores = {p: {e["event_id"]: e["score"] for e in score_entries(r, p, partitions=P)}
              for p in workers}  # fmt: skip
    assert scores["joint"] == scores["alone"] and len(scores["joint"]) == len(events)
    for consumer in workers.values():
        consumer.close()


def test_a_key_changed_before_their_one_exec_refuses_them_all_and_each_applies_once(
    redis_server, model_path
):
    """On one Redis the commits that passed their checks go in one transaction: a watched
    key changed between the checks and EXEC (another writer's commit of one partition)
    refuses them all as a conflict; each is computed and sent again, and every event is
    scored once."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, partitions=P)
    consumer.tick()  # takes the leases; nothing to read
    events = one_event_per_partition()
    publish(r, events, partitions=P)
    commit_together, writes = consumer.together.commit, consumer.committer.writes
    outcomes: list = []

    def changed_before_exec(*args):
        if not outcomes and not r.get("meddled"):
            r.set("meddled", 1)
            r.incr(KEYS.commit_seq(3))  # after the checks, before the transaction
        return writes(*args)

    def recorded(client, commits, *whole):
        got = commit_together(client, commits, *whole)
        outcomes.append(got)
        return got

    consumer.committer.writes = changed_before_exec
    consumer.together.commit = recorded
    wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= P, what="scores")
    assert len(outcomes[0]) == P  # every partition went together, first
    assert all(isinstance(o, CommitRefusedError) and o.reason == "conflict" for o in outcomes[0])
    assert consumer.metrics.count("scored") == P
    assert_scored_once_as_offline(r, events, model_path)
    consumer.close()


def blocked_in_a_read(r) -> bool:
    """Whether a client of the server waits in a blocking XREADGROUP with a command queued
    behind it (the plain read that brings what came with the entry that wakes it)."""
    return any(c.get("cmd") == "xreadgroup" and "b" in c.get("flags", "")
               and int(c.get("qbuf", 0)) > 0 for c in r.client_list())  # fmt: skip


def test_a_round_whose_states_are_all_known_builds_first_and_sends_its_checks_after(
    redis_server, model_path, tmp_path
):
    """Every user of a round known (cached by the round before): nothing goes to Redis
    before the build, no state is read, and the checks go after it, in front of the one
    transaction, the writes packed while Redis runs them (sent early, the build and the
    packing would both wait for the checks' round trip). Each event scored once."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, partitions=P)
    consumer.tick()  # takes the leases; nothing to read
    t0 = int(time.time() * 1000) - 60_000
    first = [e | {"ts": t0} for e in one_event_per_partition()]
    again = [e | {"event_id": f"again-{e['event_id']}", "ts": t0 + 1000} for e in first]
    publish(r, first, partitions=P)
    wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= P, what="round 1")
    early, commit = [], consumer.together.commit

    def spied(client, commits, whole=False, pack=None, watched=None):
        early.append(watched)  # the connection holding checks sent with the reads, if any
        return commit(client, commits, whole, pack, watched)

    consumer.together.commit = spied
    log = tmp_path / "monitor.txt"
    monitor = monitored(redis_server.port, log)
    try:
        publish(r, again, partitions=P)
        wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= 2 * P,
                 what="round 2")  # fmt: skip
        wait_for(lambda: log.read_text().count('"INCR"') >= P, what="every commit's writes")
    finally:
        monitor.terminate()
        monitor.wait()
    assert early == [None]  # one round, built before any check was sent
    order = [n for _, n in logged(log, "WATCH", "HMGET", "MULTI", "EXEC")]
    assert order == ["WATCH"] * P + ["MULTI", "EXEC"]  # no state read: every one was known
    assert_scored_once_as_offline(r, first + again, model_path)
    consumer.close()


def test_a_read_woken_by_one_entry_brings_what_was_sent_with_it_into_the_same_round(
    redis_server, model_path
):
    """Redis answers a blocked read at a producer's first XADD, with that entry alone; the
    entries pipelined with it on the other partitions come with the plain read sent behind
    it, and commit in the same round, not the next."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, partitions=P, block_ms=3000)
    first = {"user_id": "w", "type": "view", "event_id": "w0"}
    publish(r, [first], partitions=P)
    wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") == 1, what="warm-up")
    events = one_event_per_partition()
    round_ = threading.Thread(target=consumer.tick)
    round_.start()
    try:
        wait_for(lambda: blocked_in_a_read(r), what="the round's blocking read")
        publish(r, events, partitions=P)  # one pipeline: the read wakes at its first XADD
    finally:
        round_.join()
    assert consumer.metrics.count("scored") == 1 + P  # all of them in that one round
    assert_scored_once_as_offline(r, [first, *events], model_path)
    consumer.close()
