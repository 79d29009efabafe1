"""The endpoints in Redis: one hash, `{prefix}:webhooks`, endpoint name -> its JSON."""

from __future__ import annotations

import logging

import redis
from pydantic import ValidationError

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.webhooks.endpoints import Endpoint

log = logging.getLogger("intentstream.webhooks")


class EndpointError(ValueError):
    """An endpoint that cannot be added or found; the message says why."""


def load_endpoints(client: Client, keys: Keys) -> dict[str, Endpoint]:
    """Every stored endpoint that validates; one that does not is logged (by name) and left
    out, so one bad entry stops no other endpoint."""
    found = {}
    for name, raw in client.hgetall(keys.webhooks).items():
        label = name.decode(errors="replace")
        try:
            found[label] = Endpoint.model_validate_json(raw)
        except ValidationError as exc:
            fields = sorted({str(e["loc"][0]) for e in exc.errors() if e["loc"]})
            log.error(
                "endpoint ignored: stored JSON invalid", extra={"endpoint": label, "fields": fields}
            )
    return found


def get_endpoint(client: Client, keys: Keys, name: str) -> Endpoint:
    raw = client.hget(keys.webhooks, name)
    if raw is None:
        raise EndpointError(f"no endpoint named {name!r} (see `intentstream webhooks list`)")
    return Endpoint.model_validate_json(raw)


def add_endpoint(client: Client, keys: Keys, endpoint: Endpoint, replace: bool = False) -> None:
    """Store an endpoint; refuse an existing name unless `replace` (its groups, and so what
    it was delivered, stay)."""
    body = endpoint.model_dump_json()
    if replace:
        client.hset(keys.webhooks, endpoint.name, body)
    elif not client.hsetnx(keys.webhooks, endpoint.name, body):
        raise EndpointError(f"an endpoint named {endpoint.name!r} exists (--replace to change it)")


def remove_endpoint(client: Client, keys: Keys, name: str, partitions: int) -> int:
    """Remove an endpoint, its consumer groups, retry records and dead letters; the groups
    removed."""
    endpoint = get_endpoint(client, keys, name)
    client.hdel(keys.webhooks, name)
    removed = 0
    for p in range(partitions):
        try:
            removed += bool(client.xgroup_destroy(keys.actions(p), endpoint.group))
        except redis.ResponseError as exc:  # no stream yet: no group either
            if "no such key" not in str(exc).lower():
                raise
    client.delete(keys.webhook_deadletter(name))
    client.delete(*(keys.webhook_retries(name, p) for p in range(partitions)))
    return removed
