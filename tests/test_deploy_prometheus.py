"""deploy/prometheus: the alert rules, unit-tested by promtool, and checked live by the real
prometheus binary scraping a real worker."""

from __future__ import annotations

import importlib.util
import json
import re
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.deploy_tools import DEPLOY, ROOT, prometheus_tool, run, scrape_text
from tests.workers import WorkerProcess, wait_for
from worker.common.local_redis import free_port

PROM = DEPLOY / "prometheus"
RULES = PROM / "alerts.yml"
_spec = importlib.util.spec_from_file_location("render_alerts", PROM / "render_alerts.py")
render_alerts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render_alerts)
# every kind of problem issue 11 asks an alert for, by rule name
REQUIRED = {
    "IntentstreamWorkerDown", "IntentstreamLagGrowing", "IntentstreamStalled",
    "IntentstreamPartitionUnowned", "IntentstreamDeadLetterRatio", "IntentstreamSlowScores",
    "IntentstreamModelRejected", "IntentstreamRedisErrors", "IntentstreamRedisMemoryHigh",
    # and the operations review's
    "IntentstreamBadKeys", "IntentstreamLiveAucDrop", "IntentstreamModelVersionSkew",
    "IntentstreamPartitionCountMismatch",
    # and the intent rules'
    "IntentstreamRulesRejected",
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
        assert "runbook" not in notes, f"{name}: runbook_url is the annotation's name"
        # a full URL (the monitoring-mixin convention) under the rendered base
        page, _, anchor = notes["runbook_url"].partition("#")
        assert page == render_alerts.DEFAULT_BASE, f"{name}: {notes['runbook_url']}"
        assert anchor in anchors, f"{name}: no runbook {anchor}"
    assert names >= REQUIRED, f"missing: {REQUIRED - names}"


def test_committed_rules_are_rendered_for_the_default_base():
    assert re.fullmatch(r"https://[^#\s]+", render_alerts.DEFAULT_BASE)
    for name in render_alerts.FILES:
        text = (PROM / name).read_text()
        assert render_alerts.render(text, render_alerts.DEFAULT_BASE) == text, name
        assert "runbook:" not in text, name


def test_render_changes_the_base_of_every_runbook_url_and_nothing_else(tmp_path):
    base = "https://git.example.org/ops/intentstream/-/blob/v1/docs/deploy.md"
    assert render_alerts.main(["--base", base, "--out", str(tmp_path)]) == 0
    for name in render_alerts.FILES:
        committed = (PROM / name).read_text().splitlines()
        rendered = (tmp_path / name).read_text().splitlines()
        changed = [(a, b) for a, b in zip(committed, rendered, strict=True) if a != b]
        assert changed, name
        for old, new in changed:
            assert old.replace(render_alerts.DEFAULT_BASE + "#", base + "#") == new
    doc = yaml.safe_load((tmp_path / "alerts.yml").read_text())
    urls = [r["annotations"]["runbook_url"] for g in doc["groups"] for r in g["rules"]]
    assert urls and all(u.startswith(base + "#") for u in urls)
    with pytest.raises(SystemExit):
        render_alerts.main(["--base", "docs/deploy.md", "--out", str(tmp_path)])


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


def _hours(duration: str) -> float:
    """A promtool eval_time (e.g. 26h, 24h45m, 90s) in hours."""
    units = {"h": 1, "m": 1 / 60, "s": 1 / 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+)([hms])", duration))


def short_unit_tests(directory: Path) -> None:
    """Keep only the unit tests that evaluate within an hour (the day-long live-AUC ones take
    promtool most of its ~15 s): enough for the checks below, which the full run above and
    the render test already cover in full."""
    path = directory / "alerts_test.yml"
    doc = yaml.safe_load(path.read_text())
    doc["tests"] = [
        test for test in doc["tests"]
        if max(_hours(case["eval_time"]) for case in test["alert_rule_test"]) <= 1
    ]  # fmt: skip
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.mark.integration
def test_promtool_checks_and_unit_tests_the_rules(tmp_path):
    promtool = prometheus_tool("promtool")
    result = run(promtool, "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    result = run(promtool, "test", "rules", "alerts_test.yml", cwd=PROM)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
    # rendered for another runbook base, the rules pass their (rendered) unit tests too
    base = "https://runbooks.example.net/intentstream/deploy.md"
    render_alerts.main(["--base", base, "--out", str(tmp_path / "rendered")])
    short_unit_tests(tmp_path / "rendered")
    result = run(promtool, "test", "rules", "alerts_test.yml", cwd=tmp_path / "rendered")
    assert result.returncode == 0, result.stdout + result.stderr
    # the unit tests bite: a rule whose threshold moved fails them
    (tmp_path / "alerts.yml").write_text(RULES.read_text().replace("> 0.01", "> 0.1"))
    (tmp_path / "alerts_test.yml").write_text((PROM / "alerts_test.yml").read_text())
    short_unit_tests(tmp_path)
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
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as reply:
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
        # a job named as Kubernetes' prometheus.io annotations name it: the rules must not
        # depend on the job's name
        config["scrape_configs"][0]["job_name"] = "kubernetes-service-endpoints"
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
        assert alert["labels"]["job"] == "kubernetes-service-endpoints"
        assert alert["annotations"]["runbook_url"] == (
            f"{render_alerts.DEFAULT_BASE}#intentstreamworkerdown"
        )
    finally:
        worker.kill()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)
