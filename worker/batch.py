"""One partition's batch of stream entries, parsed: what the model step and the commit need.

Parsing is pure (no Redis, no state), so the worker can parse the next batch while Redis
executes the previous commit, and drop it unused if that commit fails.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass, field

from worker.events import EventError, parse_flat_entry

MAX_DEAD_FIELDS = 1000  # field pairs kept of one dead letter


def entry_id(raw: bytes) -> tuple[int, int]:
    """(ms, seq) of a stream entry id, for ordering and for its arrival time."""
    ms, _, seq = raw.partition(b"-")
    return int(ms), int(seq or 0)


def length_prefixed(*items: bytes) -> bytes:
    """Length-prefixed strings, as the Lua side reads them with '<I4c0'."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def dead_letter(raw_id: bytes, fields: list[bytes], error: str) -> bytes:
    """A dead letter for COMMIT: source_id, error, then the original field/value pairs."""
    pairs = len(fields) // 2
    if pairs > MAX_DEAD_FIELDS:
        error += f" (only the first {MAX_DEAD_FIELDS} of {pairs} fields kept)"
        pairs = MAX_DEAD_FIELDS
    return (
        length_prefixed(raw_id, error.encode())
        + struct.pack("<I", pairs)
        + length_prefixed(*fields[: 2 * pairs])
    )


@dataclass
class Batch:
    """A partition's entries, split into valid events, dead letters and lost entries."""

    partition: int
    ids: list[bytes] = field(default_factory=list)  # every entry: all are acknowledged
    users: list[str] = field(default_factory=list)  # one per valid event, in stream order
    types: list[str] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    event_ids: list[bytes] = field(default_factory=list)
    event_keys: list[tuple[int, int]] = field(default_factory=list)
    dead: list[bytes] = field(default_factory=list)  # packed for COMMIT
    lost: int = 0  # deleted while pending (nil fields)
    parse_seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.ids)


def parse_batch(partition: int, entries: list) -> Batch:
    """Parse raw XREADGROUP entries ([id, [field, value, ...] or nil]) of one partition."""
    t0 = time.perf_counter()
    b = Batch(partition)
    for raw_id, fields in entries:
        b.ids.append(raw_id)
        key = entry_id(raw_id)
        if not fields:
            b.lost += 1
            continue
        try:
            user, type_, ts = parse_flat_entry(fields, key[0])
        except EventError as exc:
            b.dead.append(dead_letter(raw_id, fields, str(exc)))
            continue
        except Exception as exc:  # a parser gap must cost one dead letter, not the worker
            error = f"unparseable entry ({type(exc).__name__}: {exc})"[:1000]
            b.dead.append(dead_letter(raw_id, fields, error))
            continue
        b.users.append(user)
        b.types.append(type_)
        b.ts.append(ts)
        b.event_ids.append(raw_id)
        b.event_keys.append(key)
    b.parse_seconds = time.perf_counter() - t0
    return b
