"""The one line a Redis failure gets names the Redis the command used: the URL it was given
(or the default it took), or, for a command that started its own redis-server (the
benchmarks, the demo without --redis-url), that private one, never a default URL it never
touched."""

from __future__ import annotations

import argparse

import redis

from worker.commands.cli import build_parser
from worker.commands.errors import explain


def _args(*argv: str) -> argparse.Namespace:
    args, _ = build_parser().parse_known_args(list(argv))
    return args


def test_a_command_on_its_own_redis_names_that_one_not_a_default_url(monkeypatch):
    monkeypatch.setenv("INTENTSTREAM_REDIS_URL", "redis://shop-redis:6379/0")
    for argv in (("bench", "--workers", "1"), ("demo",)):
        args = _args(*argv)
        line = explain(redis.ResponseError("no such key"), args)
        assert line == "the private Redis this command started replied: no such key", argv
        down = explain(redis.ConnectionError("Connection refused"), args)
        assert down == "the private Redis this command started is unreachable: Connection refused"
        assert "shop-redis" not in line + down and "--redis-url" not in down


def test_a_command_given_a_redis_names_its_url_without_the_password(monkeypatch):
    monkeypatch.delenv("INTENTSTREAM_REDIS_URL", raising=False)
    demo = _args("demo", "--redis-url", "redis://app:secret@shop-redis:6379/0")
    assert explain(redis.ResponseError("WRONGTYPE"), demo) == (
        "Redis at redis://app:***@shop-redis:6379/0 replied: WRONGTYPE"
    )
    listing = _args("model", "list")  # the settings' default
    assert explain(redis.ConnectionError("refused"), listing) == (
        "Redis at redis://localhost:6379/0 is unreachable: refused "
        "(--redis-url / INTENTSTREAM_REDIS_URL)"
    )
