"""What is POSTed for an action: its id (the `webhook-id`) and a JSON body built from the
action's stream entry alone, so every attempt, by any deliverer, sends the same bytes."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class Delivery:
    """One action (or ping) for one endpoint: where it came from and what is sent."""

    webhook_id: str
    body: bytes
    rule: str
    committed_ms: int  # the entry id's time: when the worker committed the action
    partition: int = -1  # -1: not from a stream (a ping, a replayed dead letter)
    entry_id: str = ""


def _text(fields: dict[bytes, bytes], name: bytes) -> str:
    return fields.get(name, b"").decode("utf-8", errors="replace")


def _number(text: str) -> float | int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() and "." not in text and "e" not in text else value


def _reasons(raw: str) -> object:
    try:
        return json.loads(raw) if raw else []
    except ValueError:
        return raw  # kept as the text it is


def action_id(partition: int, entry_id: str) -> str:
    """The action's id, the same for every endpoint and attempt: partition and entry id."""
    return f"act_{partition}_{entry_id}"


def from_entry(partition: int, entry_id: bytes, fields: dict[bytes, bytes]) -> Delivery:
    """The delivery of an entry of `{prefix}:actions:{p}` (docs/webhooks.md, The body)."""
    eid = entry_id.decode()
    committed_ms = int(eid.partition("-")[0])
    ident = action_id(partition, eid)
    score = _number(_text(fields, b"score"))
    doc = {
        "type": "intent.action",
        "id": ident,
        "committed_at_ms": committed_ms,
        "user_id": _text(fields, b"user_id"),
        "rule": _text(fields, b"rule"),
        "score": float(score) if score is not None else None,
        "event_id": _text(fields, b"event_id"),
        "ts": _number(_text(fields, b"ts")),
        "model": _text(fields, b"model"),
        "reasons": _reasons(_text(fields, b"reasons")),
    }
    body = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()
    return Delivery(ident, body, doc["rule"], committed_ms, partition, eid)


def ping(endpoint: str) -> Delivery:
    """`webhooks test`: a signed ping, of its own id."""
    now_ms = int(time.time() * 1000)
    ident = f"ping_{uuid.uuid4().hex}"
    doc = {"type": "intent.ping", "id": ident, "endpoint": endpoint, "sent_at_ms": now_ms}
    body = json.dumps(doc, separators=(",", ":")).encode()
    return Delivery(ident, body, "", now_ms)
