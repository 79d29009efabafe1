"""Helpers of the webhook tests: `intentstream deliver` as a real process, actions written as
the worker's commit writes them, what a receiver got checked against the spec's library."""

from __future__ import annotations

import json
import subprocess
from collections import defaultdict
from pathlib import Path

import redis
from standardwebhooks.webhooks import Webhook

from tests.conftest import console_script
from tests.processes import LoggedProcess
from tests.webhook_receiver import Received
from worker.common.local_redis import free_port

# short waits, so the faults' retries and take-overs happen within a test
FAST = ["--block-ms", "100", "--webhook-poll-seconds", "0.2", "--webhook-retry-cap-seconds",
        "1", "--webhook-claim-idle-seconds", "2", "--webhook-measure-seconds", "0.5",
        "--log-format", "json"]  # fmt: skip


class DelivererProcess(LoggedProcess):
    """An `intentstream deliver` subprocess with its log in a file and its metrics port."""

    def __init__(self, redis_url: str, log: Path, *extra: str) -> None:
        self.metrics_port = free_port()
        args = [console_script(), "deliver", "--redis-url", redis_url,
                "--metrics-port", str(self.metrics_port), *FAST, *extra]  # fmt: skip
        super().__init__(args, log)


def add_actions(client: redis.Redis, n: int, partitions: int = 1, rule: str = "coupon",
                start: int = 0) -> list[str]:  # fmt: skip
    """n actions as the worker's commit writes them, spread over the partitions; their ids
    as the deliverer names them."""
    ids = []
    for i in range(start, start + n):
        p = i % partitions
        entry = client.xadd(f"intentstream:actions:{{{p}}}", {
            "user_id": f"user-{i}", "rule": rule, "score": "0.8125", "event_id": f"ev-{i}",
            "ts": str(1764979200000 + i), "model": "1",
            "reasons": json.dumps([{"type": "add_to_cart", "ts": 1764979200000, "delta": 0.3}]),
        })  # fmt: skip
        ids.append(f"act_{p}_{entry.decode()}")
    return ids


def check_received(received: list[Received], secret: str) -> dict[str, list[Received]]:
    """Every POST signed as the spec's library verifies (the timestamp within its tolerance
    too), every attempt of one action the same body; the POSTs by webhook-id."""
    hook = Webhook(secret)
    by_id: dict[str, list[Received]] = defaultdict(list)
    for r in received:
        hook.verify(r.body, r.headers)
        by_id[r.webhook_id].append(r)
    for wid, posts in by_id.items():
        assert len({p.body for p in posts}) == 1, f"{wid}: the body changed between attempts"
        assert json.loads(posts[0].body)["id"] == wid
    return by_id


def add_endpoint(redis_url: str, name: str, url: str, secret: str, *extra: str) -> None:
    result = subprocess.run(
        [console_script(), "webhooks", "add", name, "--url", url, "--secret", secret,
         "--from-start", "--timeout", "1", "--redis-url", redis_url, *extra],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert secret not in result.stdout + result.stderr
