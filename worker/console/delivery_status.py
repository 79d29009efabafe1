"""Each feed action's webhook delivery, per endpoint that wants its rule: read from the
endpoints' consumer groups on the actions streams (XINFO GROUPS and a bounded XPENDING per
partition shown, pipelined), never by scanning."""

from __future__ import annotations

from worker.common.connection import Client
from worker.common.keys import Keys
from worker.console.action_feed import entry_order
from worker.webhooks.store import load_endpoints

# acknowledged: a 2xx, or given up as a dead letter (`webhooks replay` resends those);
# in flight: read by a deliverer, not yet acknowledged (being posted or waiting to retry);
# queued: not yet read by any deliverer
ACKNOWLEDGED, IN_FLIGHT, QUEUED = "acknowledged", "in flight", "queued"


def with_delivery(client: Client, keys: Keys, rows: list[dict]) -> list[dict]:
    """The feed's rows, each with `delivery`: [{endpoint, status}] for the endpoints that
    want its rule (none without webhooks)."""
    endpoints = load_endpoints(client, keys)
    if not endpoints or not rows:
        return [r | {"delivery": []} for r in rows]
    partitions = sorted({r["partition"] for r in rows})
    pipe = client.pipeline(transaction=False)
    for p in partitions:
        pipe.xinfo_groups(keys.actions(p))
    groups = dict(zip(partitions, pipe.execute(raise_on_error=False), strict=True))
    for p in partitions:  # the pending ids among the ones shown, per endpoint
        shown = [r["id"] for r in rows if r["partition"] == p]
        low, high = min(shown, key=entry_order), max(shown, key=entry_order)
        for e in endpoints.values():
            pipe.xpending_range(keys.actions(p), e.group, low, high, len(shown))
    pending_of: dict[tuple[int, str], set[str]] = {}
    replies = iter(pipe.execute(raise_on_error=False))
    for p in partitions:
        for e in endpoints.values():
            reply = next(replies)
            ids = [] if isinstance(reply, Exception) else reply
            pending_of[p, e.name] = {_text(x["message_id"]) for x in ids}
    last_read = {(p, _text(g["name"])): _text(g["last-delivered-id"])
                 for p, info in groups.items() if not isinstance(info, Exception)
                 for g in info}  # fmt: skip
    out = []
    for r in rows:
        status = []
        for e in endpoints.values():
            if not e.wants(r["rule"]):
                continue
            read = last_read.get((r["partition"], e.group))
            if read is None or entry_order(r["id"]) > entry_order(read):
                state = QUEUED
            elif r["id"] in pending_of[r["partition"], e.name]:
                state = IN_FLIGHT
            else:
                state = ACKNOWLEDGED
            status.append({"endpoint": e.name, "status": state})
        out.append(r | {"delivery": status})
    return out


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
