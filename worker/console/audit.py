"""Every change made through the console, appended to `{prefix}:console:audit` (who, what,
when, from where), and read back for the pages."""

from __future__ import annotations

import json
import time

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.console.auth import Identity

# The audit stream keeps about this many changes (XADD MAXLEN ~).
AUDIT_MAXLEN = 100_000


def record(
    client: Client, keys: Keys, identity: Identity, action: str, detail: dict, remote: str
) -> str:
    """Append one change; return its entry id."""
    fields = {
        "who": identity.who,
        "via": identity.via,
        "action": action,
        "detail": json.dumps(detail, sort_keys=True),
        "remote": remote,
        "ts": str(int(time.time() * 1000)),
    }
    entry = client.xadd(keys.console_audit, fields, maxlen=AUDIT_MAXLEN, approximate=True)
    return entry.decode() if isinstance(entry, bytes) else str(entry)


def recent_changes(client: Client, keys: Keys, count: int = 20) -> list[dict[str, str]]:
    """The newest changes, newest first, each as text fields with its `id`."""
    out = []
    for entry_id, fields in client.xrevrange(keys.console_audit, count=count):
        row = {k.decode(): v.decode(errors="replace") for k, v in fields.items()}
        out.append(row | {"id": entry_id.decode()})
    return out
