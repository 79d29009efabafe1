"""deploy/prometheus: the alert rules, unit-tested by promtool, and checked live by the real
prometheus binary scraping a real worker."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import urllib.request

import pytest
import yaml

from tests.deploy_tools import DEPLOY, ROOT, prometheus_tool, run, scrape_text
from tests.workers import WorkerProcess, wait_for
from worker.common.local_redis import free_port

PROM = DEPLOY / "prometheus"
RULES = PROM / "alerts.yml"
# every kind of problem issue 11 asks an alert for, by rule name
REQUIRED = {
    "IntentstreamWorkerDown", "IntentstreamLagGrowing", "IntentstreamStalled",
    "IntentstreamPartitionUnowned", "IntentstreamDeadLetterRatio", "IntentstreamSlowScores",
    "IntentstreamModelRejected", "IntentstreamRedisErrors", "IntentstreamRedisMemoryHigh",
}  # fmt: skip


def rules() -> list[dict]:
    doc = yaml.safe_load(RULES.read_text())
    return [r for group in doc["groups"] for r in group["rules"]]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = heading.strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_every_rule_has_for_severity_and_runbook_in_the_readme():
    guide = (ROOT / "docs" / "deploy.md").read_text()  # the runbooks live there
    anchors = {github_anchor(h) for h in re.findall(r"^#+ (.+)$", guide, re.M)}
    names = set()
    for rule in rules():
        name = rule["alert"]
        names.add(name)
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "")), f"{name}: no for:"
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        notes = rule["annotations"]
        assert notes.get("summary") and notes.get("description"), name
        page, _, anchor = notes["runbook"].partition("#")
        assert page == "docs/deploy.md" and anchor in anchors, f"{name}: no runbook {anchor}"
    assert names >= REQUIRED, f"missing: {REQUIRED - names}"


def test_every_rule_is_unit_tested_firing():
    tests = yaml.safe_load((PROM / "alerts_test.yml").read_text())
    assert tests["rule_files"] == ["alerts.yml"]
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == {r["alert"] for r in rules()}


@pytest.mark.integration
def test_promtool_checks_and_unit_tests_the_rules(tmp_path):
    promtool = prometheus_tool("promtool")
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    result = run(promtool, "test", "rules", "alerts_test.yml", cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # the unit tests bite: a rule whose threshold moved fails them
    (tmp_path / "alerts.yml").write_text(RULES.read_text().replace("> 0.01", "> 0.1"))
    (tmp_path / "alerts_test.yml").write_text((PROM / "alerts_test.yml").read_text())
    result = run(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path)
    assert result.returncode != 0
    assert "IntentstreamDeadLetterRatio" in result.stdout + result.stderr


@pytest.mark.integration
def test_prometheus_config_is_valid():
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert [j["job_name"] for j in config["scrape_configs"]] == ["intentstream"]
    snippet = yaml.safe_load((PROM / "scrape.yml").read_text())
    assert snippet[0]["job_name"] == "intentstream"
    # promtool resolves rule_files: point them at the real file for the check
    config["rule_files"] = [str(RULES)]
    result = run(prometheus_tool("promtool"), "check", "config", "/dev/stdin",
                 input=yaml.safe_dump(config))  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def api(port: int, path: str) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
        doc = json.load(reply)
    assert doc["status"] == "success", doc
    return doc["data"]


def worker_down_alerts(port: int, target: str) -> list[dict]:
    return [
        a
        for a in api(port, "/api/v1/alerts")["alerts"]
        if a["labels"]["alertname"] == "IntentstreamWorkerDown"
        and a["labels"].get("instance") == target
        and a["state"] in ("pending", "firing")
    ]


@pytest.mark.integration
def test_live_prometheus_scrapes_a_worker_and_alerts_when_it_stops(
    redis_server, golden_path, tmp_path
):
    metrics_port, prom_port = free_port(), free_port()
    target = f"127.0.0.1:{metrics_port}"
    worker = WorkerProcess(
        redis_server.url, golden_path, tmp_path / "worker.log", "--metrics-port", str(metrics_port)
    ).start()
    prometheus = None
    try:
        wait_for(lambda: "intentstream_events_total" in scrape_text(metrics_port), 60, "metrics")
        result = run(prometheus_tool("promtool"), "check", "metrics",
                     input=scrape_text(metrics_port))  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr

        # the deploy configuration, with this test's target and short intervals
        config = yaml.safe_load((PROM / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
        config["rule_files"] = [str(RULES)]
        config["scrape_configs"][0]["static_configs"] = [{"targets": [target]}]
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        log = (tmp_path / "prometheus.log").open("wb")
        prometheus = subprocess.Popen(
            [prometheus_tool("prometheus"),
             f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=log, stderr=log,
        )  # fmt: skip

        def scraped() -> bool:
            found = api(prom_port, "/api/v1/query?query=intentstream_events_total")["result"]
            return any(r["metric"].get("instance") == target for r in found)

        wait_for(scraped, 90, "prometheus to scrape the worker")
        up = api(prom_port, "/api/v1/query?query=up")["result"]
        assert [r["value"][1] for r in up if r["metric"]["instance"] == target] == ["1"]
        rules_loaded = api(prom_port, "/api/v1/rules")["groups"][0]["rules"]
        assert {r["name"] for r in rules_loaded} >= REQUIRED
        assert worker_down_alerts(prom_port, target) == []

        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(30) == 0
        wait_for(lambda: worker_down_alerts(prom_port, target), 90, "IntentstreamWorkerDown")
        alert = worker_down_alerts(prom_port, target)[0]
        assert alert["labels"]["severity"] == "critical"
        assert alert["annotations"]["runbook"] == "docs/deploy.md#intentstreamworkerdown"
    finally:
        worker.kill()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)
