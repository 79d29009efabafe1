"""deploy/grafana: the dashboard's PromQL parses, and every metric it (and every alert rule)
names is one a live worker exports."""

from __future__ import annotations

import json
import re

import promql_parser
import pytest
import redis
import yaml

from tests.deploy_tools import DEPLOY, metric_names, scrape_text
from tests.workers import WorkerProcess, wait_for
from worker.common.keys import Keys
from worker.common.local_redis import free_port
from worker.engine.adapters.metrics import DEAD_LETTER_OUTCOMES, EVENT_OUTCOMES
from worker.producers.publisher import publish
from worker.rules.definition import make_rule
from worker.rules.store import set_rule

DASHBOARD = DEPLOY / "grafana" / "dashboards" / "intentstream.json"
# Series Prometheus itself makes for every target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# What the operations review added: shadow version, labelled sessions, bad keys, partitions
# (the count in force beside the owned ones), batch entries under their unit's name, workers up
# whatever the job is named.
NEW_PANELS = {
    "intentstream_shadow_model_version",
    "intentstream_labelled_sessions_total",
    "intentstream_bad_keys_total",
    "intentstream_partitions",
    "intentstream_batch_entries_bucket",
    "intentstream_build_info",
}
# Issue 21's intent actions: actions by rule, the rule set in force and its reloads.
ACTION_PANELS = {
    "intentstream_actions_total",
    "intentstream_rules_version",
    "intentstream_rules_reloads_total",
}
# What issue 11 asks the dashboard to show, by a metric each panel group must name.
REQUIRED = {
    "intentstream_events_total",  # throughput by outcome, dead letters
    "intentstream_event_latency_seconds_bucket",
    "intentstream_batch_seconds_bucket",
    "intentstream_lag_entries",
    "intentstream_pending_entries",
    "intentstream_partitions_owned",
    "intentstream_model_version",
    "intentstream_model_reloads_total",
    "intentstream_redis_errors_total",
    "intentstream_redis_memory_used_bytes",
    "intentstream_redis_maxmemory_bytes",
} | NEW_PANELS
REQUIRED |= ACTION_PANELS
# Issue 47's webhook deliverers: what they did, how their attempts ended, how long from commit
# to 2xx, the oldest action waiting. A deliverer exports these, a worker none of them.
WEBHOOK_PANELS = {
    "intentstream_webhook_deliveries_total",
    "intentstream_webhook_attempts_total",
    "intentstream_webhook_delivery_latency_seconds_bucket",
    "intentstream_webhook_oldest_undelivered_seconds",
}
REQUIRED |= WEBHOOK_PANELS


def deliverers_metric(name: str) -> bool:
    return name.startswith("intentstream_webhook_")


# Grafana's built-in variables, as a query would see them.
GRAFANA_VARS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1h"}


def vectors(node) -> list[promql_parser.VectorSelector]:
    """Every vector selector of a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return [node]
    if isinstance(node, promql_parser.MatrixSelector):
        return vectors(node.vector_selector)
    if isinstance(node, promql_parser.BinaryExpr):
        return vectors(node.lhs) + vectors(node.rhs)
    if isinstance(node, promql_parser.Call):
        return [v for a in node.args for v in vectors(a)]
    if isinstance(node, promql_parser.AggregateExpr):
        return vectors(node.expr) + (vectors(node.param) if node.param else [])
    if isinstance(node, promql_parser.ParenExpr | promql_parser.UnaryExpr):
        return vectors(node.expr)
    if isinstance(node, promql_parser.SubqueryExpr):
        return vectors(node.expr)
    return []


def selectors(node) -> set[str]:
    """Metric names of every vector selector in a parsed PromQL expression."""
    return {v.name for v in vectors(node) if v.name}


def parse(expr: str):
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    return promql_parser.parse(expr)


def selected(vector: promql_parser.VectorSelector, label: str, values: tuple[str, ...]) -> set:
    """Which of `values` of `label` the selector's matchers let through."""

    def lets_through(m, v: str) -> bool:
        op = str(m.op).rsplit(".", 1)[-1]  # MatchOp is not hashable
        found = re.fullmatch(m.value, v) is not None if op in ("Re", "NotRe") else v == m.value
        return found if op in ("Re", "Equal") else not found

    matchers = [m for m in vector.matchers.matchers if m.name == label]
    return {v for v in values if all(lets_through(m, v) for m in matchers)}


def metrics_of(expr: str) -> set[str]:
    return selectors(parse(expr))


def dashboard_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"])
        for panel in doc["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def rule_queries() -> list[tuple[str, str]]:
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return [(r["alert"], r["expr"]) for g in doc["groups"] for r in g["rules"]]


def test_selector_walk_finds_every_metric():
    expr = (
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="1"}[5m])))'
        " / on() -(b) + deriv(max(c)[10m:1m])"
    )
    assert metrics_of(expr) == {"a_bucket", "b", "c"}


def test_dead_letters_are_every_dead_letter_outcome():
    """A query that counts dead letters counts every outcome that dead-letters an entry
    (misrouted ones too), and nothing else; the alert and the dashboard both count them."""
    counting = set()
    for where, queries in (("panel", dashboard_queries()), ("alert", rule_queries())):
        for title, expr in queries:
            for vector in vectors(parse(expr)):
                if vector.name != "intentstream_events_total":
                    continue
                chosen = selected(vector, "outcome", EVENT_OUTCOMES)
                if chosen & set(DEAD_LETTER_OUTCOMES) and chosen != set(EVENT_OUTCOMES):
                    assert chosen == set(DEAD_LETTER_OUTCOMES), f"{where} {title!r}: {expr}"
                    counting.add(where)
    assert counting == {"panel", "alert"}


def test_dashboard_structure():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["uid"] == "intentstream-worker"
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in doc["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]


def test_job_and_instance_variables_narrow_every_query():
    doc = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    for name in ("job", "instance"):
        v = variables[name]
        assert v["type"] == "query" and v["includeAll"] and v["multi"], name
        assert v["datasource"]["uid"] == "${datasource}", name
        assert "intentstream_build_info" in v["query"]["query"], name
    assert "$job" in variables["instance"]["query"]["query"]
    for title, expr in dashboard_queries():
        for vector in vectors(parse(expr)):
            found = {
                (m.name, str(m.op).rsplit(".", 1)[-1], m.value) for m in vector.matchers.matchers
            }
            for name in ("job", "instance"):
                assert (name, "Re", f"${name}") in found, f"panel {title!r}: {vector}"


def test_every_query_parses_and_the_required_metrics_are_shown():
    named = set()
    for title, expr in dashboard_queries():
        try:
            named |= metrics_of(expr)
        except Exception as exc:  # the parser raises its own error types
            raise AssertionError(f"panel {title!r}: {expr}: {exc}") from None
    assert named >= REQUIRED, f"not on the dashboard: {REQUIRED - named}"
    assert not {n for n in named if not re.match(r"^(intentstream_|up$)", n)}


@pytest.mark.integration
def test_dashboard_and_alerts_name_only_metrics_a_live_worker_exports(
    redis_server, golden_path, tmp_path
):
    """Fails while the worker does not export a metric a panel or an alert reads (e.g. the
    Redis memory gauges until the worker exports them)."""
    port = free_port()
    client = redis.Redis.from_url(redis_server.url)
    set_rule(client, Keys(), make_rule(name="first", above=0.0))  # fires once per session
    worker = WorkerProcess(
        redis_server.url, golden_path, tmp_path / "worker.log", "--metrics-port", str(port)
    ).start()
    try:
        publish(client, [{"user_id": f"u{i}", "type": "view"} for i in range(20)])
        client.xadd("intentstream:events:{0}", {"junk": "no user"})  # a dead letter

        def settled() -> bool:
            text = scrape_text(port)
            return (
                "intentstream_lag_entries{" in text
                and 'outcome="deadletter"} 1.0' in text
                and 'intentstream_actions_total{rule="first"}' in text
            )

        wait_for(settled, 60, "a batch, a dead letter, an action and a maintenance tick")
        exported = metric_names(scrape_text(port)) | PROMETHEUS_SERIES
    finally:
        worker.terminate()
    missing = {
        f"{where} {title!r}: {name}"
        for where, queries in (("panel", dashboard_queries()), ("alert", rule_queries()))
        for title, expr in queries
        for name in metrics_of(expr)
        if name not in exported and not deliverers_metric(name)  # a deliverer's: below
    }
    assert not missing, "named but not exported:\n" + "\n".join(sorted(missing))
    assert exported >= NEW_PANELS | ACTION_PANELS
    assert not {n for n in exported if deliverers_metric(n)}


@pytest.mark.integration
def test_webhook_panels_and_alerts_name_only_metrics_a_live_deliverer_exports(
    redis_server, tmp_path
):
    from tests.deliverers import DelivererProcess, add_actions, add_endpoint
    from tests.webhook_receiver import Receiver
    from worker.webhooks.signing import new_secret

    receiver = Receiver().start()
    add_endpoint(redis_server.url, "crm", receiver.url, new_secret())
    ids = add_actions(redis_server.client(), 3)
    deliverer = DelivererProcess(redis_server.url, tmp_path / "d.log").start()
    try:
        wait_for(lambda: set(receiver.ok_ids()) >= set(ids), 60, "three deliveries")
        exported = metric_names(scrape_text(deliverer.metrics_port))
    finally:
        deliverer.terminate()
        receiver.stop()
    named = {
        f"{where} {title!r}: {name}"
        for where, queries in (("panel", dashboard_queries()), ("alert", rule_queries()))
        for title, expr in queries
        for name in metrics_of(expr)
        if deliverers_metric(name) and name not in exported
    }
    assert not named, "named but not exported:\n" + "\n".join(sorted(named))
    assert exported >= WEBHOOK_PANELS
    assert "intentstream_build_info" not in exported, "a deliverer would count as a worker"
