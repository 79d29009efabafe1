"""A cold batch's commit checks go early, with its states' read, under WATCH on the connection
its commit then takes (engine/adapters/early_checks.py): two round trips where there were
three. Seen from Redis's side (MONITOR): the WATCH before the reads, one WATCH per commit,
then the transaction. When the built commit writes streams the checks were not made for
(actions a rule fired), its checks go again behind an UNWATCH; a commit landing while the
batch is built is a conflict; a failure while it is built leaves nothing held. Every event
is scored once, as offline scoring gives it."""

from __future__ import annotations

import time

import pytest

from tests.consumers import in_process_consumer
from tests.test_commit_together import logged, monitored
from tests.test_worker import offline_scores
from tests.workers import score_entries, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.store import set_rule

pytestmark = pytest.mark.integration

KEYS = Keys()
T0 = int(time.time() * 1000) - 3_600_000  # an hour ago: never ahead of the entries' times


def events_of(users: list[str], first: int) -> list[dict]:
    """A view, then an add_to_cart, by each user, a second apart; event ids from `first`
    on (their times fixed: offline scoring sees the same gaps whenever they are sent)."""
    kinds = ["view", "add_to_cart"]
    out = [{"user_id": u, "type": t} for t in kinds for u in users]
    return [e | {"event_id": f"e{first + i}", "ts": T0 + (first + i) * 1000}
            for i, e in enumerate(out)]  # fmt: skip


def scored_once_as_offline(r, events: list[dict], model_path) -> None:
    rows = score_entries(r)
    assert sorted(row["event_id"] for row in rows) == sorted(e["event_id"] for e in events)
    by_id = {row["event_id"]: float(row["score"]) for row in rows}
    want = offline_scores(model_path, events)
    assert [by_id[e["event_id"]] for e in events] == pytest.approx(list(want), abs=1e-5)


def test_a_cold_batch_takes_its_reads_with_the_checks_then_the_transaction(
    redis_server, model_path, tmp_path
):
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path)
    consumer.tick()  # takes the lease; nothing to read
    events = events_of(["ann", "bob"], 0)
    publish(r, events)
    log = tmp_path / "monitor.txt"
    monitor = monitored(redis_server.port, log)
    try:
        wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= len(events),
                 what="every event scored")  # fmt: skip
        wait_for(lambda: '"EXEC"' in log.read_text(), what="the commit logged")
    finally:
        monitor.terminate()
        monitor.wait()
    order = [n for _, n in logged(log, "WATCH", "HMGET", "MULTI", "EXEC", "UNWATCH")]
    # one WATCH (its checks early), the states' reads behind it, one transaction
    assert order == ["WATCH", "HMGET", "HMGET", "MULTI", "EXEC"]
    scored_once_as_offline(r, events, model_path)
    consumer.close()


def test_a_commit_writing_streams_the_checks_were_not_made_for_sends_them_again(
    redis_server, model_path, tmp_path
):
    """A rule fires on every score: the partition's first commit writes actions, which the
    early checks did not watch, so its checks go again behind an UNWATCH; the next commit's
    early checks are made for the streams that one wrote, and go once."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path, model_poll_seconds=0.01)
    set_rule(r, consumer.keys, make_rule(name="any", above=0.0, rearm_below=0.0))
    wait_for(lambda: consumer.tick() or consumer.rulebook.table is not None, what="the rule")
    log = tmp_path / "monitor.txt"
    monitor = monitored(redis_server.port, log)
    first, second = events_of(["ann"], 0), events_of(["bob"], 10)
    try:
        for events, scored in ((first, 2), (second, 4)):
            publish(r, events)
            wait_for(lambda n=scored: consumer.tick() or consumer.metrics.count("scored") >= n,
                     what="the batch scored")  # fmt: skip
        wait_for(lambda: log.read_text().count('"EXEC"') >= 2, what="both commits logged")
    finally:
        monitor.terminate()
        monitor.wait()
    order = [n for _, n in logged(log, "WATCH", "UNWATCH", "EXEC")]
    assert order == ["WATCH", "UNWATCH", "WATCH", "EXEC", "WATCH", "EXEC"]
    # each user's first event fires it (it re-arms below 0: never)
    assert r.xlen(KEYS.actions(0)) == 2
    assert consumer.metrics.value("intentstream_actions_total", rule="any") == 2
    scored_once_as_offline(r, first + second, model_path)
    consumer.close()


def test_a_commit_landing_while_the_batch_is_built_is_a_conflict(redis_server, model_path):
    """The batch's states and checks were read under WATCH; another writer's commit lands
    while it is built: EXEC applies nothing, the batch is computed again and scored once."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path)
    consumer.tick()
    build, landed = consumer.models.build, []

    def another_commit_lands(batch, states):
        if not landed:
            landed.append(r.incr(KEYS.commit_seq(0)))
        return build(batch, states)

    consumer.models.build = another_commit_lands
    events = events_of(["ann", "bob", "cy"], 0)
    publish(r, events)
    wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= len(events),
             what="every event scored")  # fmt: skip
    assert landed
    assert consumer.metrics.value("intentstream_commit_retries_total", reason="conflict") == 1
    assert consumer.metrics.count("scored") == len(events)
    scored_once_as_offline(r, events, model_path)
    consumer.close()


def test_a_failure_while_the_batch_is_built_holds_nothing_and_loses_nothing(
    redis_server, model_path
):
    """The build fails once after the states, the checks and a read of new entries went:
    the connection that held the WATCH is dropped, the entries read are read again, and
    every event is scored once."""
    r = connect(redis_server.url)
    consumer = in_process_consumer(redis_server.url, model_path)
    consumer.tick()
    read_watched, build, failed = consumer.flow._read_watched, consumer.models.build, []

    def arriving_first(batch, users, parts):
        if not failed:
            publish(r, events[4:])  # read behind the states, before the build
        return read_watched(batch, users, parts)

    def fails_once(batch, states):
        if not failed:
            failed.append(batch)
            raise RuntimeError("the build failed")
        return build(batch, states)

    consumer.flow._read_watched = arriving_first
    consumer.models.build = fails_once
    events = events_of(["ann", "bob", "cy", "dee"], 0)
    publish(r, events[:4])
    with pytest.raises(RuntimeError, match="the build failed"):
        for _ in range(20):
            consumer.tick()
    wait_for(lambda: consumer.tick() or consumer.metrics.count("scored") >= len(events),
             what="every event scored")  # fmt: skip
    assert len(failed) == 1 and consumer.metrics.count("scored") == len(events)
    scored_once_as_offline(r, events, model_path)
    consumer.close()
