"""Retries of any size are scored once: a resent pipeline, and publish() through a stall."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from collections import Counter

import redis
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import console_script
from tests.deploy_tools import scrape_text
from tests.workers import WorkerProcess, all_committed, count_scores, score_entries, wait_for
from worker.common.connection import connect
from worker.common.events import Event
from worker.common.keys import Keys
from worker.common.local_redis import free_port
from worker.producers.publisher import entry_fields, publish, stamps

STREAM0 = Keys().events(0)


def states_n(r: redis.Redis, users: set[str]) -> dict[str, int]:
    return {u: int(r.hget(Keys().state(0, u), "n") or 0) for u in users}


def drained(r: redis.Redis) -> bool:
    """Every entry delivered to the group and committed (the position is the last one)."""
    groups = r.xinfo_groups(STREAM0)
    return bool(groups) and groups[0]["lag"] == 0 and all_committed(r)


def test_a_resent_1000_event_pipeline_with_a_busy_user_is_scored_once(
    redis_server, model_path, tmp_path
):
    """The same pipeline XADDed twice, as publish() resends it after a lost reply: the
    user with 50 events among the 1,000 is applied 50 times, not 100 (the event-id window
    of 32 alone would double 18 of them and then slide past the rest)."""
    r = connect(redis_server.url)
    users = ["busy"] * 50 + [f"u{i % 97}" for i in range(950)]
    users = users[::2] + users[1::2]  # the busy user's events spread through the pipeline
    fresh = stamps()
    chunk = []
    for u in users:
        stamp, event_id = next(fresh)
        chunk.append(entry_fields(Event(user_id=u, type="view", event_id=event_id,
                                        producer=stamp)))  # fmt: skip
    for _ in range(2):
        pipe = r.pipeline(transaction=False)
        for fields in chunk:
            pipe.xadd(STREAM0, fields)
        pipe.execute()
    worker = WorkerProcess(redis_server.url, model_path, tmp_path / "w.log",
                           "--batch-size", "128").start()  # fmt: skip
    try:
        wait_for(lambda: drained(r), what="all 2,000 entries acked")
    finally:
        assert worker.terminate() == 0, worker.log()
    assert count_scores(r) == 1000
    assert states_n(r, set(users)) == Counter(users)
    rows = score_entries(r)
    assert len({row["event_id"] for row in rows}) == 1000


def test_publish_through_a_redis_stall_past_its_socket_timeout_doubles_nothing(
    redis_server, model_path, tmp_path
):
    """Redis stopped for 2.5 s under a 1 s socket timeout: publish() resends its pipeline
    while the first copy still sits in Redis's socket buffer, and both land."""
    r = connect(redis_server.url)
    producer = redis.Redis.from_url(redis_server.url, socket_timeout=1)
    users = ["n40"] * 20 + [f"u{i}" for i in range(21)]
    events = [{"user_id": u, "type": "view"} for u in users]
    publish(producer, events[:1])  # connected, and the partition count checked
    users, events = users + users[:1], events + events[:1]
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    resume = threading.Timer(2.5, os.kill, (redis_server.process.pid, signal.SIGCONT))
    resume.start()
    try:
        publish(producer, events[:-1], pipeline_size=100)
    finally:
        resume.join()
    landed = r.xlen(STREAM0)
    assert landed > len(events), "the stall did not make publish() resend"
    worker = WorkerProcess(redis_server.url, model_path, tmp_path / "w.log").start()
    try:
        wait_for(lambda: drained(r), what="every copy acked")
    finally:
        assert worker.terminate() == 0, worker.log()
    assert count_scores(r) == len(events), f"{landed} entries landed for {len(events)} events"
    assert states_n(r, set(users)) == Counter(users)


def republished(
    redis_url: str, model_path, tmp_path, *flags: str
) -> tuple[dict[str, int], int, str]:
    """A JSON-lines file of 3 users x 40 events with their own event_ids, published twice by
    the console script while a worker runs (with `flags`): each user's n, the score entries,
    and the worker's /metrics after both copies."""
    users = [f"busy{k}" for k in range(3)]
    events = tmp_path / "events.jsonl"
    events.write_text("".join(
        json.dumps({"user_id": u, "type": "view", "event_id": f"{u}-order-{i}"}) + "\n"
        for i in range(40) for u in users
    ))  # fmt: skip
    port = free_port()
    worker = WorkerProcess(redis_url, model_path, tmp_path / "w.log",
                           "--metrics-port", str(port), "--batch-size", "16",
                           *flags).start()  # fmt: skip
    r = connect(redis_url)
    try:
        for copy in (1, 2):  # each run a new producer: only the ids tell the copies apart
            subprocess.run([console_script(), "publish", "--redis-url", redis_url, str(events)],
                           check=True, capture_output=True, timeout=120)  # fmt: skip
            wait_for(lambda c=copy: r.xlen(STREAM0) == 120 * c and drained(r),
                     what=f"copy {copy} committed")  # fmt: skip
        text = scrape_text(port)
    finally:
        assert worker.terminate() == 0, worker.log()
    return states_n(r, set(users)), count_scores(r), text


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"{name} {labels} not exported")


def test_a_republished_file_with_own_event_ids_scores_a_busy_user_once(
    redis_server, model_path, tmp_path
):
    """40 events per user, republished: n stays 40 (a count window of 32 ids made it 80)."""
    n, scores, text = republished(redis_server.url, model_path, tmp_path)
    assert n == {"busy0": 40, "busy1": 40, "busy2": 40}
    assert scores == 120
    assert metric(text, "intentstream_events_total", outcome="duplicate") == 120
    assert metric(text, "intentstream_resend_window_overflow_total") == 0


def test_ids_the_bound_forgets_within_the_window_are_counted(redis_server, model_path, tmp_path):
    """With a bound of 16 ids a user's memory forgets ids within the window: each forgotten
    one counted, and the resend scored again, as documented (the second copy's first ids
    push out the last 16 of the first copy before their own copies come)."""
    n, scores, text = republished(redis_server.url, model_path, tmp_path, "--event-id-window", "16")
    assert n == {"busy0": 80, "busy1": 80, "busy2": 80}
    assert scores == 240
    # per user: 24 forgotten early by the first copy, 40 by the second
    assert metric(text, "intentstream_resend_window_overflow_total") == 3 * (24 + 40)
