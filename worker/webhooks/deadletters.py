"""An endpoint's dead letters: deliveries given up at the maximum age, kept in
`{prefix}:webhooks:deadletter:<name>` with the body sent, the last status and error, and
sent again by `webhooks replay`."""

from __future__ import annotations

import time
from dataclasses import dataclass

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.webhooks.attempt import Attempt
from worker.webhooks.payload import Delivery

# approximate length each endpoint's dead-letter stream is trimmed to
DEADLETTER_MAXLEN = 100_000


@dataclass(frozen=True)
class DeadLetter:
    """A delivery given up: what was sent, and how its last attempt ended."""

    entry_id: bytes  # of the dead-letter stream
    delivery: Delivery
    attempts: int
    last: str


def dead_letter_fields(delivery: Delivery, attempts: int, last: Attempt) -> dict[str, object]:
    return {
        "webhook_id": delivery.webhook_id,
        "body": delivery.body,
        "rule": delivery.rule,
        "committed_ms": delivery.committed_ms,
        "partition": delivery.partition,
        "entry_id": delivery.entry_id,
        "attempts": attempts,
        "last_status": "" if last.status is None else last.status,
        "last_error": last.error or "",
        "dead_at_ms": int(time.time() * 1000),
    }


def add_dead_letter(pipe, keys: Keys, name: str, fields: dict[str, object]) -> None:
    """Queue the dead letter's XADD on a pipeline (before the action's XACK)."""
    pipe.xadd(keys.webhook_deadletter(name), fields, maxlen=DEADLETTER_MAXLEN, approximate=True)


def read_dead_letters(
    client: Client, keys: Keys, name: str, since_ms: int = 0, count: int = 1000
) -> list[DeadLetter]:
    """Up to `count` dead letters of an endpoint given up at or after since_ms, oldest first."""
    out = []
    for eid, f in client.xrange(keys.webhook_deadletter(name), min=f"{since_ms}-0", count=count):
        delivery = Delivery(
            webhook_id=f[b"webhook_id"].decode(),
            body=f[b"body"],
            rule=f.get(b"rule", b"").decode(errors="replace"),
            committed_ms=int(f.get(b"committed_ms", b"0")),
            partition=int(f.get(b"partition", b"-1")),
            entry_id=f.get(b"entry_id", b"").decode(),
        )
        status, error = f.get(b"last_status", b"").decode(), f.get(b"last_error", b"").decode()
        out.append(
            DeadLetter(
                eid, delivery, int(f.get(b"attempts", b"0")), f"HTTP {status}" if status else error
            )
        )
    return out


def drop_dead_letter(client: Client, keys: Keys, name: str, entry_id: bytes) -> None:
    """Remove a dead letter delivered by a replay."""
    client.xdel(keys.webhook_deadletter(name), entry_id)
