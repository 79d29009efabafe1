"""docs/deploy.md "Sizing and retention": the bytes per user state, retained event and score
entry it states are what Redis reports (MEMORY USAGE) after a real worker scored synthetic
traffic."""

from __future__ import annotations

import re
import time

import pytest
import redis

from model.artifact import save_model
from model.data.synthetic import synthetic_events
from model.random_init import random_model
from tests.deploy_tools import ROOT
from tests.workers import WorkerProcess, count_scores, wait_for
from worker.producers.publisher import publish

ROWS = {"user state": "state", "retained input event": "event", "score entry": "score"}


def readme_sizes() -> dict[str, int]:
    """The 'bytes each' column of the sizing table (docs/deploy.md), by row."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    sizes = {}
    for row, key in ROWS.items():
        match = re.search(rf"^\| {row} \| ~?([\d,]+) \|", text, re.M)
        assert match, f"docs/deploy.md sizing table has no row {row!r}"
        sizes[key] = int(match[1].replace(",", ""))
    return sizes


@pytest.mark.integration
def test_readme_sizing_matches_redis(redis_server, tmp_path):
    model = tmp_path / "h64.npz"
    kinds = ["view", "add_to_cart", "coupon", "purchase"]
    save_model(random_model(kinds, hidden=64, features=["gap"]), model)  # the training default
    client = redis.Redis.from_url(redis_server.url)
    n, users = 20_000, 1_000
    publish(
        client, synthetic_events(n, users, seed=0, start_ms=int(time.time() * 1000) - 86_400_000)
    )
    worker = WorkerProcess(redis_server.url, model, tmp_path / "worker.log").start()
    try:
        wait_for(lambda: count_scores(client) == n, 120, f"{n} scores")
    finally:
        worker.terminate()
    states = list(client.scan_iter("intentstream:state:*", count=1000))
    measured = {
        "event": client.memory_usage("intentstream:events:{0}", samples=0) / n,
        "score": client.memory_usage("intentstream:scores:{0}", samples=0) / n,
        "state": sum(client.memory_usage(k, samples=0) for k in states) / len(states),
    }
    stated = readme_sizes()
    for key, value in measured.items():
        assert 0.7 * value <= stated[key] <= 1.4 * value, (
            f"{key}: docs/deploy.md {stated[key]}, measured {value:.0f}"
        )
