"""`intentstream deliver` against a real HTTP receiver: every action delivered at least once,
signed (verified by the standardwebhooks library), the same body on every attempt, a second
copy only after a failed attempt or a crash; through 500s, stalls past the timeout, reset
connections, a receiver down then up, kill -9 of the deliverer and a Redis restart."""

from __future__ import annotations

import json
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from tests.deliverers import DelivererProcess, add_actions, add_endpoint, check_received
from tests.deploy_tools import scrape_text
from tests.webhook_receiver import Receiver
from tests.workers import wait_for
from worker.webhooks.signing import new_secret

ACTIONS0 = "intentstream:actions:{0}"


def metric(port: int, name: str, **labels: str) -> float:
    """A sample of the deliverer's /metrics, parsed by prometheus_client (0 when absent)."""
    for family in text_string_to_metric_families(scrape_text(port)):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def delivered_all(receiver: Receiver, ids: list[str]) -> bool:
    return set(receiver.ok_ids()) >= set(ids)


def test_healthy_receivers_get_every_action_once_signed_and_only_their_rules(
    redis_server, tmp_path
):
    client = redis_server.client()
    client.hset("intentstream:config", "partitions", 2)
    every, coupons = Receiver().start(), Receiver().start()
    s1, s2 = new_secret(), new_secret()
    add_endpoint(redis_server.url, "crm", every.url, s1)
    add_endpoint(redis_server.url, "coupons", coupons.url, s2, "--rules", "coupon")
    ids = add_actions(client, 120, partitions=2, rule="coupon")
    others = add_actions(client, 30, partitions=2, rule="nudge", start=120)
    deliverer = DelivererProcess(redis_server.url, tmp_path / "d.log").start()
    try:
        wait_for(lambda: delivered_all(every, ids + others) and delivered_all(coupons, ids),
                 60, "every action at both endpoints")  # fmt: skip
        port = deliverer.metrics_port
        wait_for(lambda: metric(port, "intentstream_webhook_deliveries_total",
                                endpoint="coupons", outcome="skipped") == 30,
                 30, "skips")  # fmt: skip
        assert Counter(every.ok_ids()) == Counter(ids + others), "each exactly once"
        assert Counter(coupons.ok_ids()) == Counter(ids)
        check_received(every.all(), s1)
        check_received(coupons.all(), s2)
        first = json.loads(every.all()[0].body)
        assert set(first) == {"type", "id", "committed_at_ms", "user_id", "rule", "score",
                              "event_id", "ts", "model", "reasons"}  # fmt: skip
        assert first["score"] == 0.8125 and first["reasons"][0]["type"] == "add_to_cart"
        assert metric(port, "intentstream_webhook_deliveries_total", endpoint="crm",
                      outcome="delivered") == 150  # fmt: skip
        assert metric(port, "intentstream_webhook_attempts_total", endpoint="crm",
                      result="2xx") == 150  # fmt: skip
        assert metric(port, "intentstream_webhook_delivery_latency_seconds_count",
                      endpoint="crm") == 150  # fmt: skip
        wait_for(lambda: metric(port, "intentstream_webhook_endpoints") == 2, 10, "gauge")
        for group in client.xinfo_groups(ACTIONS0):
            assert group["pending"] == 0 and group["lag"] == 0, group
        assert deliverer.terminate() == 0
    finally:
        deliverer.kill()
        every.stop()
        coupons.stop()
    log = deliverer.log()
    assert s1 not in log and s2 not in log
    assert all(json.loads(line) for line in log.splitlines()), "JSON log lines"


def faulty(n: int) -> str:
    """The first 80 requests cycle through every failure; then all is well."""
    return ("500", "stall", "reset", "ok")[n % 4] if n < 80 else "ok"


def test_500s_stalls_resets_and_a_receiver_down_then_up_lose_nothing(redis_server, tmp_path):
    client = redis_server.client()
    bad = Receiver(plan=faulty, stall_s=1.5).start()
    good = Receiver().start()
    s_bad, s_good = new_secret(), new_secret()
    add_endpoint(redis_server.url, "flaky", bad.url, s_bad)
    add_endpoint(redis_server.url, "steady", good.url, s_good)
    deliverer = DelivererProcess(redis_server.url, tmp_path / "d.log").start()
    try:
        ids = add_actions(client, 100)
        wait_for(lambda: len(bad.all()) >= 80, 90, "the failing requests")
        bad.stop()  # down: connections refused
        more = add_actions(client, 100, start=100)
        # the steady endpoint is not held back by the one that is down
        wait_for(lambda: delivered_all(good, ids + more), 60, "the steady endpoint")
        port = deliverer.metrics_port
        wait_for(lambda: metric(port, "intentstream_webhook_attempts_total", endpoint="flaky",
                                result="connection") > 0, 30, "refused attempts")  # fmt: skip
        bad.start()  # up again on the same port
        wait_for(lambda: delivered_all(bad, ids + more), 120, "the flaky endpoint, once up")
        for result in ("5xx", "timeout", "connection"):
            assert metric(port, "intentstream_webhook_attempts_total", endpoint="flaky",
                          result=result) > 0, result  # fmt: skip
    finally:
        deliverer.terminate()
        bad.stop()
        good.stop()
    by_id = check_received(bad.all(), s_bad)
    assert Counter(bad.ok_ids()) == Counter(ids + more), "one 200 in time per action"
    failed = {wid for wid, posts in by_id.items() if any(p.mode != "ok" for p in posts)}
    assert all(len(posts) == 1 for wid, posts in by_id.items() if wid not in failed)
    assert failed, "the faults should have failed some attempts"
    assert Counter(good.ok_ids()) == Counter(ids + more)
    check_received(good.all(), s_good)


def test_kill_9_of_a_deliverer_mid_run_loses_no_action(redis_server, tmp_path):
    client = redis_server.client()
    receiver = Receiver(delay_s=0.01).start()  # slow enough to kill it with POSTs in flight
    secret = new_secret()
    add_endpoint(redis_server.url, "crm", receiver.url, secret)
    ids = add_actions(client, 600)
    first = DelivererProcess(redis_server.url, tmp_path / "first.log").start()
    try:
        wait_for(lambda: len(receiver.ok_ids()) >= 100, 60, "a share delivered")
        first.kill()
        assert len(set(receiver.ok_ids())) < len(ids), "killed before the end"
        second = DelivererProcess(redis_server.url, tmp_path / "second.log").start()
        try:
            wait_for(lambda: delivered_all(receiver, ids), 120, "the rest, by the second")
            wait_for(lambda: client.xpending(ACTIONS0, "webhook:crm")["pending"] == 0, 30,
                     "every entry acknowledged")  # fmt: skip
        finally:
            assert second.terminate() == 0
    finally:
        first.kill()
        receiver.stop()
    by_id = check_received(receiver.all(), secret)
    assert set(by_id) == set(ids)
    twice = [wid for wid, posts in by_id.items() if len(posts) > 1]
    # a second copy only of what the killed process had read and not acknowledged: at most
    # what its senders had in hand (a read of up to 100 entries each)
    assert len(twice) <= 4 * 100, len(twice)


def test_a_redis_restart_is_ridden_out(aof_redis_server, tmp_path):
    client = aof_redis_server.client()
    receiver = Receiver().start()
    secret = new_secret()
    add_endpoint(aof_redis_server.url, "crm", receiver.url, secret)
    deliverer = DelivererProcess(aof_redis_server.url, tmp_path / "d.log").start()
    try:
        ids = add_actions(client, 50)
        wait_for(lambda: delivered_all(receiver, ids), 60, "the first actions")
        aof_redis_server.stop()
        port = deliverer.metrics_port
        wait_for(lambda: metric(port, "intentstream_webhook_redis_errors_total") > 0, 60,
                 "the deliverer to meet the outage")  # fmt: skip
        aof_redis_server.start()
        client = aof_redis_server.client()
        more = add_actions(client, 50, start=50)
        wait_for(lambda: delivered_all(receiver, ids + more), 90, "the actions after the restart")
        assert deliverer.terminate() == 0
    finally:
        deliverer.kill()
        receiver.stop()
    by_id = check_received(receiver.all(), secret)
    assert set(by_id) == set(ids + more)


def test_past_the_maximum_age_a_dead_letter_then_replay_delivers_it(redis_server, tmp_path):
    from tests.conftest import run_cli

    client = redis_server.client()
    down = {"on": True}
    receiver = Receiver(plan=lambda n: "500" if down["on"] else "ok").start()
    secret = new_secret()
    add_endpoint(redis_server.url, "crm", receiver.url, secret)
    ids = add_actions(client, 5)
    deliverer = DelivererProcess(redis_server.url, tmp_path / "d.log",
                                 "--webhook-max-age-seconds", "3").start()  # fmt: skip
    dead = "intentstream:webhooks:deadletter:crm"
    try:
        wait_for(lambda: client.xlen(dead) == 5, 60, "five dead letters")
        port = deliverer.metrics_port
        wait_for(lambda: metric(port, "intentstream_webhook_deliveries_total", endpoint="crm",
                                outcome="dead_letter") == 5, 30, "counted")  # fmt: skip
        wait_for(lambda: client.xpending(ACTIONS0, "webhook:crm")["pending"] == 0, 30, "acked")
    finally:
        assert deliverer.terminate() == 0
    letter = client.xrange(dead, count=1)[0][1]
    # (on a busy machine the deliverer may start past the maximum age: one attempt then)
    assert letter[b"last_status"] == b"500" and int(letter[b"attempts"]) >= 1
    assert letter[b"webhook_id"].decode() in ids
    assert receiver.ok_ids() == []
    refused = run_cli("webhooks", "replay", "crm", "--redis-url", redis_server.url)
    assert refused.returncode == 1 and "5 failed and kept" in refused.stdout, refused.stdout
    down["on"] = False
    result = run_cli("webhooks", "replay", "crm", "--since", "1h", "--redis-url",
                     redis_server.url)  # fmt: skip
    assert result.returncode == 0 and "5 delivered, 0 failed" in result.stdout, result.stdout
    assert client.xlen(dead) == 0
    receiver.stop()
    by_id = check_received(receiver.all(), secret)
    assert Counter(receiver.ok_ids()) == Counter(ids), "the same webhook-ids, once each"
    assert all(len({p.body for p in posts}) == 1 for posts in by_id.values())


def retry_record(client) -> tuple[int, float]:
    """The one action's retry record: its failures and when it is due (epoch seconds)."""
    record = client.hgetall("intentstream:webhooks:retry:crm:{0}")
    if not record:
        return 0, 0.0
    ((_, value),) = record.items()
    failures, due_ms = value.decode().split(":")
    return int(failures), int(due_ms) / 1000


def test_a_restarted_deliverer_goes_on_with_the_backoff_kept_in_redis(redis_server, tmp_path):
    client = redis_server.client()
    receiver = Receiver(plan=lambda n: "500").start()
    add_endpoint(redis_server.url, "crm", receiver.url, new_secret())
    add_actions(client, 1)
    same = ("--consumer", "d1", "--webhook-retry-cap-seconds", "60")  # waits 1, 2, 4, 8 s
    first = DelivererProcess(redis_server.url, tmp_path / "first.log", *same).start()
    try:
        wait_for(lambda: retry_record(client)[0] >= 3, 60, "three failed attempts recorded")
    finally:
        first.kill()  # kill -9: what it held in memory is gone
    failures, due = retry_record(client)
    sent = len(receiver.all())
    assert sent == failures
    second = DelivererProcess(redis_server.url, tmp_path / "second.log", *same).start()
    try:  # the same consumer name: it reads its pending entry again at once
        wait_for(lambda: len(receiver.all()) > sent, 60, "the next attempt")
        wait_for(lambda: retry_record(client)[0] == failures + 1, 30, "the count going on")
    finally:
        second.kill()
        receiver.stop()
    after = receiver.all()[sent]
    assert after.at >= due - 0.05, f"retried {due - after.at:.1f} s before it was due"


def test_actions_trimmed_before_they_were_read_are_counted_lost_once(redis_server, tmp_path):
    client = redis_server.client()
    receiver = Receiver().start()
    add_endpoint(redis_server.url, "crm", receiver.url, new_secret())
    first = add_actions(client, 5)
    deliverer = DelivererProcess(redis_server.url, tmp_path / "first.log").start()
    try:
        wait_for(lambda: delivered_all(receiver, first), 60, "the first actions")
    finally:
        assert deliverer.terminate() == 0
    # while no deliverer runs, the worker's trim (XTRIM MAXLEN) passes unread actions
    gone = add_actions(client, 15, start=5)
    kept = add_actions(client, 5, start=20)
    client.xtrim(ACTIONS0, maxlen=5, approximate=False)
    deliverer = DelivererProcess(redis_server.url, tmp_path / "second.log").start()
    port = deliverer.metrics_port
    try:
        wait_for(lambda: delivered_all(receiver, kept), 60, "the actions still in the stream")
        wait_for(lambda: metric(port, "intentstream_webhook_deliveries_total", endpoint="crm",
                                outcome="lost") >= 15, 30, "the trimmed ones counted")  # fmt: skip
        (group,) = client.xinfo_groups(ACTIONS0)
        assert group["lag"] == 0, "its read counter moved past them: counted once"
        assert metric(port, "intentstream_webhook_deliveries_total", endpoint="crm",
                      outcome="lost") == 15  # fmt: skip
        assert deliverer.terminate() == 0
    finally:
        deliverer.kill()
        receiver.stop()
    assert Counter(receiver.ok_ids()) == Counter(first + kept)
    assert not set(gone) & set(receiver.ok_ids())
    assert '"actions": 15' in deliverer.log() and "trimmed before delivery" in deliverer.log()
