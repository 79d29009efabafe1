"""The retained event history in Redis, read back for training (docs/contract.md, Training
data and labels)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import redis

from worker.common.dedup import MAX_WINDOW, Memory, Producer, ResendWindow
from worker.common.entry_ids import entry_id
from worker.common.events import (
    DEFAULT_MAX_TS_SKEW_MS,
    EventError,
    extra_values,
    flat_fields,
    input_values,
    parse_flat_entry,
)
from worker.common.keys import Keys


def read_history(
    client: redis.Redis, prefix: str, partitions: int, page: int = 10_000,
    max_skew_ms: int = DEFAULT_MAX_TS_SKEW_MS, fields: Sequence[str] | None = (),
) -> tuple[list[dict], int]:  # fmt: skip
    """Every parseable event of the partition streams, in stream order, with XRANGE pages;
    and the number of entries skipped as unparseable or out of the timestamp rule (the
    worker dead-letters those) or as a producer's retry of an event already read (same
    user and event_id). Each event keeps the named extra `fields` it carries (None: every
    one), as text, read as the worker reads declared inputs."""
    keys = Keys(prefix)
    extras = _extras_reader(fields)
    events: list[dict] = []
    skipped = 0
    memory: dict[str, Memory] = {}

    def admit(user: str, event_id: bytes | None, producer: Producer | None, ms: int) -> bool:
        if event_id is None and producer is None:
            return True
        if user not in memory:
            memory[user] = Memory(b"", ResendWindow(ids=MAX_WINDOW))
        return memory[user].admit(event_id, producer, ms // 1000)

    for p in range(partitions):
        stream, start = keys.events(p), "-"
        while True:
            entries = client.execute_command("XRANGE", stream, start, "+", "COUNT", page)
            for raw_id, fields in entries:
                ms = entry_id(raw_id)[0]
                flat = flat_fields(fields)
                try:
                    user, type_, ts, event_id, producer = parse_flat_entry(flat, ms, max_skew_ms)
                except EventError:
                    skipped += 1
                    continue
                if not admit(user, event_id, producer, ms):
                    skipped += 1
                    continue
                events.append({"user_id": user, "type": type_, "ts": ts, **extras(flat)})
            if len(entries) < page:
                break
            start = "(" + entries[-1][0].decode()
    return events, skipped


def _extras_reader(fields: Sequence[str] | None) -> Callable[[list], dict[str, str]]:
    """What an event keeps of its entry's extra fields: the named ones, or every one."""
    if fields is None:
        return lambda flat: {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                             for k, v in extra_values(flat).items()}  # fmt: skip
    names = tuple(f.encode() for f in fields)
    if not names:
        return lambda flat: {}

    def named(flat: list) -> dict[str, str]:
        values = input_values(flat, names)
        return {n: v.decode("utf-8", "replace") for n, v in zip(fields, values, strict=True)
                if v is not None}  # fmt: skip

    return named
