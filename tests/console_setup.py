"""What the console's tests share: tokens, a registry with two versions, retained events."""

from __future__ import annotations

from pathlib import Path

import redis

from model.data.synthetic import synthetic_events
from worker.lifecycle.registry import Registry
from worker.producers.publisher import publish

EDITOR_TOKEN = "editor-token-for-tests-0123456789"
VIEWER_TOKEN = "viewer-token-for-tests-9876543210"
TOKEN_ENV = {
    "INTENTSTREAM_CONSOLE_TOKEN": EDITOR_TOKEN,
    "INTENTSTREAM_CONSOLE_VIEWER_TOKEN": VIEWER_TOKEN,
}


def two_versions(client: redis.Redis, model_path: Path) -> Registry:
    """The model published twice: version 1 current, version 2 a candidate to promote."""
    registry = Registry(client)
    data = model_path.read_bytes()
    registry.publish(data, promote=True)
    registry.publish(data)
    return registry


def publish_events(client: redis.Redis, n: int, users: int, seed: int) -> list[dict]:
    """Synthetic shop events (with purchases) published to partition 0; returned as sent."""
    events = list(synthetic_events(n, users, seed=seed))
    publish(client, events)
    return events
