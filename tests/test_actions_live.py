"""Intent actions from outside: a worker with rules set writes the actions that `intentstream
rules backtest` predicts, entry for entry; rules reload while it runs, and a bad rule set is
refused with the running one kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model.data.synthetic import synthetic_events
from tests.actions_check import action_entries, pinned, set_firing_rules
from tests.conftest import run_cli
from tests.test_worker import scrape
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.common.connection import connect
from worker.common.keys import Keys, partition_of
from worker.common.local_redis import free_port
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.store import set_rule

pytestmark = pytest.mark.integration

P = 2
KEYS = Keys()


def metric(port: int, name: str) -> float | None:
    """One sample of the worker's metrics, None while it does not answer."""
    try:
        return scrape(port).get(name)
    except OSError:
        return None


def events_with_ids(n: int, users: int, seed: int) -> list[dict]:
    return [e | {"event_id": f"e{i}"} for i, e in enumerate(synthetic_events(n, users, seed=seed))]


def backtest(redis_url: str, *args: str) -> dict:
    result = run_cli("rules", "backtest", "--redis-url", redis_url, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def as_entries(report: dict) -> dict[int, list[tuple]]:
    """The backtest's actions per partition, as the actions stream's entries."""
    out: dict[int, list[tuple]] = {p: [] for p in range(P)}
    for a in report["actions"]:
        out[partition_of(a["user_id"], P)].append(
            (a["user_id"], a["rule"], f"{a['score']:.9g}", a["event_id"], str(a["ts"]),
             a["model"], json.dumps(a["reasons"], separators=(",", ":")))
        )  # fmt: skip
    return out


def test_the_live_actions_stream_equals_the_backtest_entry_for_entry(
    redis_server, model_path, tmp_path
):
    events = events_with_ids(6000, 300, seed=5)
    r = connect(redis_server.url)
    set_firing_rules(r, model_path, events)
    worker = WorkerProcess(redis_server.url, model_path, tmp_path / "w.log",
                           "--partitions", str(P), "--batch-size", "64").start()  # fmt: skip
    try:
        # published while the worker runs, in bursts: batches are cut wherever reads fall
        for i in range(0, len(events), 700):
            publish(r, events[i : i + 700], partitions=P)
        wait_for(lambda: count_scores(r, partitions=P) >= len(events), timeout=120,
                 what="all scores")  # fmt: skip
    finally:
        assert worker.terminate() == 0
    live = action_entries(r, P)
    assert sum(map(len, live.values())) > 50
    report = backtest(redis_server.url, "--from-redis", "--model", str(model_path))
    assert report["model"] == pinned(model_path).version
    assert as_entries(report) == live
    figures = report["rules"]
    assert set(figures) == {"hot", "cart", "late"}
    for name, f in figures.items():
        assert f["actions"] == sum(a[1] == name for p in live for a in live[p])
        assert f["precision"] is None or 0.0 <= f["precision"] <= 1.0
        assert f["recall"] is None or 0.0 <= f["recall"] <= 1.0


def test_backtest_of_an_event_file_with_a_rules_file(redis_server, model_path, tmp_path):
    events = events_with_ids(3000, 150, seed=6)
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events) + "not json\n")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"name": "any", "above": 0.0, "rearm_below": 0.0}]))
    report = backtest(redis_server.url, "--data", str(data), "--rules", str(rules), "--model",
                      str(model_path))  # fmt: skip
    # fires at each session's first event and never re-arms within it
    sessions = 0
    last: dict[str, int] = {}
    for e in events:
        if e["user_id"] not in last or e["ts"] - last[e["user_id"]] > 1800 * 1000:
            sessions += 1
        last[e["user_id"]] = max(last.get(e["user_id"], 0), e["ts"])
    gap = pinned(model_path).model.meta.session_gap_seconds
    assert gap == 1800.0
    assert report["rules"]["any"]["actions"] == sessions == len(report["actions"])
    text = run_cli("rules", "backtest", "--redis-url", redis_server.url, "--data", str(data),
                   "--rules", str(rules), "--model", str(model_path))  # fmt: skip
    assert text.returncode == 0 and "precision" in text.stdout
    assert "skipped" in text.stderr or "line" in text.stderr  # the bad line is reported
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"name": "x", "above": 0.5, "rearm_below": 0.9}]))
    refused = run_cli("rules", "backtest", "--redis-url", redis_server.url, "--data", str(data),
                      "--rules", str(bad), "--model", str(model_path))  # fmt: skip
    assert refused.returncode == 2 and "rearm_below" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_rules_reload_while_running_and_a_bad_set_is_refused(redis_server, model_path, tmp_path):
    r = connect(redis_server.url)
    port = free_port()
    worker = WorkerProcess(redis_server.url, model_path, tmp_path / "w.log", "--metrics-port",
                           str(port), "--model-poll-seconds", "0.5").start()  # fmt: skip
    try:
        wait_for(lambda: metric(port, "intentstream_rules_version") == 0.0, what="up")
        set_rule(r, KEYS, make_rule(name="first", above=0.0, rearm_below=0.0))
        wait_for(lambda: metric(port, "intentstream_rules_version") == 1.0, what="loaded")
        publish(r, [{"user_id": "a", "type": "view"}, {"user_id": "a", "type": "view"}])
        wait_for(lambda: r.xlen(KEYS.actions(0)) == 1, what="one action")
        # a hand-written rule that does not validate: the whole set is refused, once
        r.hset(KEYS.rules, "broken", b'{"name": "broken", "above": "high"}')
        r.hincrby(KEYS.rules, ":version", 1)
        r.publish(KEYS.rules_updates, "2")
        rejected = 'intentstream_rules_reloads_total{result="rejected"}'
        wait_for(lambda: metric(port, rejected) == 1.0, what="the refusal")
        assert metric(port, "intentstream_rules_version") == 1.0
        publish(r, [{"user_id": "b", "type": "view"}])  # the old set still acts
        wait_for(lambda: r.xlen(KEYS.actions(0)) == 2, what="an action under the old set")
        r.hdel(KEYS.rules, "broken")
        r.hincrby(KEYS.rules, ":version", 1)
        wait_for(lambda: metric(port, "intentstream_rules_version") == 3.0, what="fixed")
        assert metric(port, rejected) == 1.0
    finally:
        assert worker.terminate() == 0
    log = worker.log()
    assert "intent rules refused" in log and "broken" in log


def test_backtest_of_real_shop_events_in_open_cdp_csv(redis_server, model_path, tmp_path):
    sample = Path(__file__).parent / "data" / "rees46_sample.csv"
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"name": "any", "above": 0.0, "rearm_below": 0.0}]))
    report = backtest(redis_server.url, "--data", str(sample), "--format", "opencdp", "--rules",
                      str(rules), "--model", str(model_path))  # fmt: skip
    # the rule fires at every session's first event: as many actions as sessions with inputs
    figures = report["rules"]["any"]
    assert figures["actions"] == len(report["actions"]) == figures["actioned_sessions"] > 100
    assert figures["purchasing_sessions"] > 10 and 0 < figures["recall"] <= 1
    wrong = run_cli("rules", "backtest", "--redis-url", redis_server.url, "--data", str(sample),
                    "--columns", "user_id=user_id", "--rules", str(rules))  # fmt: skip
    assert wrong.returncode == 2 and "--columns" in wrong.stderr
