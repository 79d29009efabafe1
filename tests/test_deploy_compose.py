"""deploy/compose.yaml: valid against the compose specification, and wired as promised."""

from __future__ import annotations

import hashlib
import re
import shlex
from urllib.parse import urlsplit

import pytest
import yaml

from tests.deploy_tools import DEPLOY, run, venv_tool
from tests.test_deploy_acl import acl_users
from worker.commands.cli import build_parser

COMPOSE = DEPLOY / "compose.yaml"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def intentstream_services(compose: dict) -> dict[str, dict]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if svc.get("image", "").startswith("intentstream:")
    }


def seconds(duration: str) -> float:
    value = 0.0
    for number, unit in re.findall(r"(\d+)(ms|h|m|s)", duration):
        value += int(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return value


@pytest.mark.integration
def test_valid_against_the_compose_specification(tmp_path):
    tool = venv_tool("check-jsonschema")
    result = run(tool, "--builtin-schema", "vendor.compose-spec", str(COMPOSE))
    assert result.returncode == 0, result.stdout + result.stderr
    # the schema does bite: an unknown service key fails
    bad = tmp_path / "compose.yaml"
    bad.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_perod:", 1))
    result = run(tool, "--builtin-schema", "vendor.compose-spec", str(bad))
    assert result.returncode != 0 and "stop_grace_perod" in result.stdout + result.stderr


def test_redis_is_configured_for_state(compose):
    redis = compose["services"]["redis"]
    assert redis["command"] == ["redis-server", "/usr/local/etc/redis/redis.conf"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in redis["volumes"]}
    assert mounts["/usr/local/etc/redis/redis.conf"] == "./redis/redis.conf"
    assert mounts["/usr/local/etc/redis/users.acl"] == "./redis/users.acl"
    assert "/data" in mounts, "the AOF must live on a volume"
    conf = (DEPLOY / "redis" / "redis.conf").read_text()
    assert re.search(r"^aclfile /usr/local/etc/redis/users.acl$", conf, re.M)
    assert re.search(r"^maxmemory-policy noeviction$", conf, re.M)
    assert re.search(r"^appendfsync everysec$", conf, re.M)
    assert "ping" in redis["healthcheck"]["test"]
    assert re.fullmatch(r"redis:7\.\d+\.\d+(-\w+)?", redis["image"]), "pin Redis 7 (ACL selectors)"


def test_two_workers_a_producer_and_a_training_profile(compose):
    services = intentstream_services(compose)
    workers = {n: s for n, s in services.items() if s.get("command") == ["worker"]}
    assert len(workers) == 2
    consumers = {s["environment"]["INTENTSTREAM_CONSUMER"] for s in workers.values()}
    assert len(consumers) == 2, "each worker needs its own consumer name"
    for name, svc in workers.items():
        assert seconds(svc["stop_grace_period"]) >= 10, f"{name}: grace shorter than a batch"
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
    assert services["producer"]["command"][0] == "publish"
    assert services["train"]["profiles"] == ["train"]
    assert services["train"]["command"][:2] == ["train", "--from-redis"]
    partitions = {s["environment"]["INTENTSTREAM_PARTITIONS"] for s in services.values()}
    assert len(partitions) == 1, "every job must agree on the partition count"


def test_commands_parse_with_the_real_cli(compose):
    parser = build_parser()
    for name, svc in intentstream_services(compose).items():
        if svc.get("entrypoint") == ["sh", "-c"]:
            script = svc["command"][0]
            commands = re.findall(r"intentstream ([^|;&{}]+)", script)
            assert commands, name
            argvs = [shlex.split(c) for c in commands]
        else:
            argvs = [svc["command"]]
        for argv in argvs:
            parser.parse_args(argv)  # exits (SystemExit) on an unknown flag


def test_each_job_uses_its_acl_user_with_the_acl_password(compose):
    users = acl_users()
    expected_user = {"worker": "worker", "publish": "producer", "train": "trainer",
                     "console": "console", "deliver": "deliverer"}  # fmt: skip
    for name, svc in intentstream_services(compose).items():
        url = urlsplit(svc["environment"]["INTENTSTREAM_REDIS_URL"])
        command = svc["command"][0]
        want = expected_user.get(command, "trainer")  # the bootstrap writes the registry
        assert url.username == want, f"{name} connects as {url.username}"
        digest = hashlib.sha256(url.password.encode()).hexdigest()
        assert f"#{digest}" in users[url.username], f"{name}: password not in users.acl"


def test_published_ports_are_loopback_only(compose):
    for name, svc in compose["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} to every address"


def test_prometheus_and_grafana_are_provisioned(compose):
    prom = compose["services"]["prometheus"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in prom["volumes"]}
    assert mounts["./prometheus/alerts.yml"] == "/etc/prometheus/alerts.yml"
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    targets = config["scrape_configs"][0]["static_configs"][0]["targets"]
    scraped = [n for n, s in intentstream_services(compose).items()
               if s["command"] in (["worker"], ["deliver"])]  # fmt: skip
    assert sorted(targets) == sorted(f"{w}:9108" for w in scraped)
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    assert mounts["./grafana/dashboards"] == "/var/lib/grafana/dashboards"
    assert mounts["./grafana/provisioning"] == "/etc/grafana/provisioning"
    provider = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/dashboards/intentstream.yml").read_text()
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert source["datasources"][0]["url"] == "http://prometheus:9090"


def test_the_console_is_opt_in_and_needs_a_token_of_yours(compose):
    console = intentstream_services(compose)["console"]
    assert console["profiles"] == ["console"]
    assert console["command"][:3] == ["console", "--host", "0.0.0.0"]
    token = console["environment"]["INTENTSTREAM_CONSOLE_TOKEN"]
    assert re.fullmatch(r"\$\{INTENTSTREAM_CONSOLE_TOKEN:\?[^}]+\}", token), "no token in the file"
    assert console["ports"] == ["127.0.0.1:9200:9200"]


def test_a_deliverer_under_its_user_scraped_and_given_time_to_stop(compose):
    services = intentstream_services(compose)
    (name,) = [n for n, s in services.items() if s["command"] == ["deliver"]]
    deliverer = services[name]
    assert urlsplit(deliverer["environment"]["INTENTSTREAM_REDIS_URL"]).username == "deliverer"
    assert deliverer["environment"]["INTENTSTREAM_CONSUMER"], "a stable consumer name"
    assert seconds(deliverer["stop_grace_period"]) >= 10, "POSTs in flight end within --timeout"
    assert deliverer["healthcheck"] == {"disable": True}, "no /healthz: the image's check fails"
    assert deliverer["ports"] == ["127.0.0.1:9110:9108"]
    assert deliverer["environment"]["INTENTSTREAM_PARTITIONS"] == "4"
