"""Helpers to run `intentstream worker` as a real process and wait on what it writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.exceptions import RedisClusterException  # not a RedisError

from tests.conftest import console_script
from tests.processes import LoggedProcess


class WorkerProcess(LoggedProcess):
    """An `intentstream worker` subprocess with its log in a file."""

    def __init__(self, redis_url: str, model: Path, log: Path, *extra: str) -> None:
        super().__init__([
            console_script(), "worker",
            "--redis-url", redis_url,
            "--model", str(model),
            "--metrics-port", "0",
            "--log-format", "json",
            "--block-ms", "200",
            *extra,
        ], log)  # fmt: skip


def wait_for(condition: Callable[[], bool], timeout: float = 60, what: str = "condition") -> None:
    """Poll until condition() is true; fail with `what` after timeout seconds. Connection
    errors (Redis, an HTTP endpoint not listening yet, or a cluster mid-failover whose
    slots are not all covered) count as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except (OSError, redis.RedisError, RedisClusterException):
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def score_entries(
    client: redis.Redis, prefix: str = "intentstream", partitions: int = 1
) -> list[dict]:
    """Every score entry of every partition, decoded."""
    out = []
    for p in range(partitions):
        for sid, fields in client.xrange(f"{prefix}:scores:{{{p}}}"):
            row = {k.decode(): v.decode() for k, v in fields.items()}
            out.append(row | {"id": sid.decode(), "partition": p})
    return out


def count_scores(client: redis.Redis, prefix: str = "intentstream", partitions: int = 1) -> int:
    return sum(client.xlen(f"{prefix}:scores:{{{p}}}") for p in range(partitions))


def all_committed(client: redis.Redis, prefix: str = "intentstream", partitions: int = 1) -> bool:
    """Every partition's position (its last commit's last entry, `acked`) is its stream's
    last entry: every entry was committed (a stream with no entry: nothing to commit)."""
    for p in range(partitions):
        newest = client.xrevrange(f"{prefix}:events:{{{p}}}", count=1)
        if newest and client.get(f"{prefix}:acked:{{{p}}}") != newest[0][0]:
            return False
    return True
