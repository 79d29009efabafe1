"""Settings from flags and environment, and the worker/publish commands' edges."""

from __future__ import annotations

import argparse
import json
import os
import subprocess

import pytest
import redis

from model.data.synthetic import purchase_probability
from tests.conftest import console_script, run_cli
from worker.common.connection import connect
from worker.common.keys import partition_of
from worker.common.settings import (
    Settings,
    SettingsError,
    add_setting_flags,
    load_settings,
    unknown_variables,
)


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_setting_flags(p)
    return p.parse_args(argv)


def test_defaults_follow_the_spec(monkeypatch):
    for k in list(os.environ):
        if k.startswith("INTENTSTREAM_"):
            monkeypatch.delenv(k)
    s = load_settings(parse())
    assert s.redis_url == "redis://localhost:6379/0"
    assert (s.prefix, s.partitions, s.group) == ("intentstream", 1, "intentstream-workers")
    assert (s.metrics_host, s.metrics_port) == ("127.0.0.1", 9108)
    assert str(os.getpid()) in s.consumer


def test_flag_wins_over_environment(monkeypatch):
    monkeypatch.setenv("INTENTSTREAM_PARTITIONS", "4")
    monkeypatch.setenv("INTENTSTREAM_PREFIX", "fromenv")
    s = load_settings(parse("--partitions", "8"))
    assert s.partitions == 8 and s.prefix == "fromenv"


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (["--block-ms", "6000"], {},
         "--block-ms (6000) must stay below 80% of --socket-timeout (5 s)"),
        (["--partitions", "0"], {}, "--partitions: must be >= 1, got 0"),
        (["--batch-size", "0"], {}, "--batch-size: must be >= 1, got 0"),
        (["--socket-timeout", "0"], {}, "--socket-timeout: must be > 0, got 0"),
        (["--partitions", "5000"], {}, "--partitions: must be <= 4096, got 5000"),
        ([], {"INTENTSTREAM_BATCH_SIZE": "lots"},
         "INTENTSTREAM_BATCH_SIZE: expected an integer, got 'lots'"),
        ([], {"INTENTSTREAM_BATCH_SIZE": "0"}, "INTENTSTREAM_BATCH_SIZE: must be >= 1, got 0"),
        (["--redis-url", "http://localhost"], {},
         "--redis-url: must start with redis://, rediss:// or unix://, got 'http'"),
        (["--prefix", "a{b}"], {},
         "--prefix: must be non-empty, without braces or whitespace, got 'a{b}'"),
        (["--log-format", "xml"], {}, "--log-format: must be 'json', 'text' or 'auto', got 'xml'"),
    ],
)  # fmt: skip
def test_invalid_configuration_names_the_flag_or_variable(monkeypatch, argv, env, line):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SettingsError) as info:
        load_settings(parse(*argv))
    assert str(info.value) == line


def test_the_workers_bad_setting_reads_as_every_other_commands_bad_flag():
    result = run_cli("worker", "--batch-size", "0", "--log-format", "text",
                     "--redis-url", "redis://127.0.0.1:1/0")  # fmt: skip
    assert (result.returncode, result.stderr) == (2, "error: --batch-size: must be >= 1, got 0\n")
    rules = run_cli("rules", "set", "x", "--above", "0.5", "--min-events", "0")
    assert rules.stderr.startswith("error: --min-events: must be >= 1, got 0")


def test_tls_url_is_accepted():
    s = Settings(redis_url="rediss://user:pw@cache.example:6380/0")
    assert s.redis_url.startswith("rediss://")
    client = connect(s.redis_url)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["username"] == "user" and kwargs["password"] == "pw"
    assert client.connection_pool.connection_class.__name__ == "SSLConnection"


def test_worker_refuses_bad_configuration_at_start():
    result = run_cli("worker", "--block-ms", "9000", "--model", "x.npz")
    assert result.returncode == 2
    assert "--block-ms (9000) must stay below" in result.stderr and "Traceback" not in result.stderr


def test_worker_refuses_a_broken_model_file(tmp_path):
    bad = tmp_path / "m.npz"
    bad.write_bytes(b"garbage")
    result = run_cli("worker", "--model", str(bad), "--metrics-port", "0")
    assert result.returncode == 2 and "not a valid .npz archive" in result.stderr


def test_worker_reports_a_taken_metrics_port(golden_path, redis_server):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = run_cli("worker", "--model", str(golden_path), "--redis-url", redis_server.url,
                         "--metrics-port", str(port), "--max-seconds", "1")  # fmt: skip
    assert result.returncode == 2 and "--metrics-port" in result.stderr


def test_publish_puts_events_on_their_partition_streams(redis_server, tmp_path):
    events = [{"user_id": f"user{i}", "type": "view", "ts": 1000 + i} for i in range(50)]
    lines = [json.dumps(e) for e in events]
    lines.insert(10, "{broken")
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    result = run_cli("publish", str(path), "--redis-url", redis_server.url, "--partitions", "4")
    assert result.returncode == 1  # the bad line is reported, the rest published
    assert "line 11: not valid JSON" in result.stderr
    r = connect(redis_server.url)
    got = []
    for p in range(4):
        for _, fields in r.xrange(f"intentstream:events:{{{p}}}"):
            user = fields[b"user_id"].decode()
            assert partition_of(user, 4) == p
            got.append(user)
    assert sorted(got) == sorted(e["user_id"] for e in events)


def test_publish_synthetic(redis_server):
    result = run_cli(
        "publish", "--synthetic", "500", "--users", "50", "--redis-url", redis_server.url
    )
    assert result.returncode == 0, result.stderr
    r = connect(redis_server.url)
    assert r.xlen("intentstream:events:{0}") == 500
    assert "published 500 events" in result.stderr


def test_synthetic_purchase_odds_depend_on_order():
    same_bag = ["coupon", "add_to_cart", "checkout"]
    assert purchase_probability(same_bag) > 2 * purchase_probability(same_bag[::-1])


def test_console_script_lists_its_commands():
    out = subprocess.run([console_script(), "--help"], capture_output=True, text=True).stdout
    for command in ("model", "score", "worker", "publish"):
        assert command in out


def test_an_unknown_variable_is_named_with_the_closest_setting():
    env = {"INTENTSTREAM_BATCHSIZE": "5", "INTENTSTREAM_TRACEBACK": "1",
           "INTENTSTREAM_PREFIX": "x", "INTENTSTREAM_ZZZ": "1", "PATH": "/bin"}  # fmt: skip
    assert unknown_variables(env) == [
        "INTENTSTREAM_BATCHSIZE is not a setting and is ignored "
        "(did you mean INTENTSTREAM_BATCH_SIZE?)",
        "INTENTSTREAM_ZZZ is not a setting and is ignored",
    ]


def test_start_up_refusals_are_json_under_json_logs(monkeypatch):
    monkeypatch.setenv("INTENTSTREAM_BATCHSIZE", "5")
    result = run_cli("worker", "--log-format", "json", "--block-ms", "9000", "--metrics-port", "0")
    assert result.returncode == 2
    lines = [json.loads(line) for line in result.stderr.strip().splitlines()]
    assert [r["level"] for r in lines] == ["warning", "error"], result.stderr
    assert "INTENTSTREAM_BATCH_SIZE" in lines[0]["msg"] and "--block-ms" in lines[1]["msg"]
    text = run_cli("worker", "--block-ms", "9000", "--metrics-port", "0")
    assert text.stderr.startswith("warning: INTENTSTREAM_BATCHSIZE is not a setting")


def test_a_worker_that_refuses_to_start_leaves_nothing_in_redis(redis_server):
    # no model in the registry: refused after every other check, before recording anything
    result = run_cli("worker", "--redis-url", redis_server.url, "--metrics-port", "0")
    assert result.returncode == 2 and "no current model" in result.stderr, result.stderr
    assert redis.Redis.from_url(redis_server.url).keys("*") == []
