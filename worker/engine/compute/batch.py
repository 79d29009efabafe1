"""One partition's batch of stream entries, parsed: what the pipeline and the commit need.

Parsing is pure (no Redis, no state), so the worker can parse the next batch while Redis
executes the previous commit, and drop it unused if that commit fails.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from model.input_bytes import RawInputs
from worker.common.dedup import MAX_TIME, Producer
from worker.common.entry_ids import entry_id
from worker.common.events import (
    DEFAULT_MAX_TS_SKEW_MS,
    EventError,
    flat_fields,
    parse_flat_entry,
)
from worker.common.keys import partition_of
from worker.engine.compute.columnar import parsed_columns, same_names
from worker.engine.compute.input_fields import raw_inputs

# Batches of fewer entries are parsed one by one: the columns' fixed cost (their kernel
# calls, ~100 µs on the 2-core VM) is more than the loop's ~4 µs an entry below about 32
# (at low traffic a batch is an event or two)
COLUMNS_FROM = 32


def _id_ms(raw: bytes) -> int:
    """The time of an entry id, 0 when it has none readable (the parse decides then)."""
    ms = raw.partition(b"-")[0]
    return int(ms) if ms.isdigit() else 0


def seconds_of(entry_keys: list[tuple[int, int]]) -> np.ndarray:
    """Each event's entry time in whole seconds (within MAX_TIME), as memories keep times."""
    if len(entry_keys) < COLUMNS_FROM:  # numpy's three calls cost more than a few values
        return np.array([min(ms // 1000, MAX_TIME) for ms, _ in entry_keys], np.int64)
    ms = np.fromiter(map(itemgetter(0), entry_keys), np.float64, len(entry_keys))
    return np.minimum(ms // 1000, MAX_TIME).astype(np.int64)


@dataclass(frozen=True)
class DeadLetter:
    """An entry that is not a valid event: its id, why, and its original fields."""

    source_id: bytes
    error: str
    fields: list[bytes]  # field, value, field, value, ...


@dataclass
class Batch:
    """A partition's entries, split into valid events, dead letters and lost entries."""

    partition: int
    ids: list[bytes] = field(default_factory=list)  # every entry: all are acknowledged
    users: list[str] = field(default_factory=list)  # one per valid event, in stream order
    types: list[str] = field(default_factory=list)
    ts: list[int] = field(default_factory=list)
    entry_ids: list[bytes] = field(default_factory=list)  # stream id of each valid event
    entry_keys: list[tuple[int, int]] = field(default_factory=list)  # the same, as (ms, seq)
    # their times in whole seconds (`seconds_of`); None until the resends stage needs them
    entry_seconds: np.ndarray | None = None
    event_ids: list[bytes | None] = field(default_factory=list)  # the producer's, if given
    producers: list[Producer | None] = field(default_factory=list)  # publish()'s stamps
    # the raw values of the declared inputs asked for (a model's, format 2), per valid event
    inputs: RawInputs | None = None
    dead: list[DeadLetter] = field(default_factory=list)  # invalid and misrouted entries
    misrouted: int = 0  # of the dead letters: users of another partition
    lost: int = 0  # found deleted when read (nil fields; Redis returns none such for ">")
    parse_seconds: float = 0.0
    # the entry this batch follows in its stream: its commit applies only while that is the
    # partition's last commit (adapters/streams.py)
    after: bytes = b"0-0"

    def __len__(self) -> int:
        return len(self.ids)


def _parsed_by_columns(
    partition: int, entries: list, partitions: int, max_skew_ms: int, wanted: tuple[bytes, ...]
) -> Batch | None:
    """The batch parsed column by column (compute/columnar.py) when its entries are all
    valid events in one layout; else None."""
    flats = [e[1] for e in entries]
    if set(map(type, flats)) != {list} or not same_names(flats):
        return None
    ids = [e[0] for e in entries]
    cols = parsed_columns(ids, flats, partition, partitions, max_skew_ms)
    if cols is None:
        return None
    b = Batch(partition, ids, cols.users, cols.types, cols.ts, list(ids), cols.entry_keys,
              cols.seconds, cols.event_ids, cols.producers)  # fmt: skip
    if wanted:
        b.inputs = raw_inputs(flats, wanted, one_order=True)
    return b


def id_time_problem(entry_ms: int, now_ms: int, max_skew_ms: int) -> str | None:
    """Why an entry without `ts`, whose time is its id's, breaks the timestamp rule: an id
    (an explicit one a producer chose) more than `max_skew_ms` ahead of the clock; or None."""
    if entry_ms - now_ms <= max_skew_ms:
        return None
    return (f"no ts, and the entry id's time {entry_ms} is {entry_ms - now_ms} ms ahead of the "
            f"clock ({now_ms}); at most {max_skew_ms} ms allowed (max-ts-skew-ms)")  # fmt: skip


def parse_batch(
    partition: int, entries: list, partitions: int = 1, max_skew_ms: int = DEFAULT_MAX_TS_SKEW_MS,
    input_names: tuple[str, ...] = (), now_ms: int | None = None,
) -> Batch:  # fmt: skip
    """Parse raw XREADGROUP entries ([id, [field, value, ...] or nil]) of one partition of
    `partitions`; an event whose user belongs to another partition, or whose time breaks
    the timestamp rule (`max_skew_ms`; an entry without `ts` whose id is that far ahead of
    the clock `now_ms`, default the wall clock, too), is a dead letter. The raw values of
    `input_names` (the declared inputs of the models that will score it) are kept per valid
    event."""
    t0 = time.perf_counter()
    wanted = tuple(n.encode() for n in input_names)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    # ids rise: only a batch whose last id is ahead of the clock has one to check
    ahead = bool(entries) and _id_ms(entries[-1][0]) - now_ms > max_skew_ms
    try:
        b = (
            None
            if ahead or len(entries) < COLUMNS_FROM
            else _parsed_by_columns(partition, entries, partitions, max_skew_ms, wanted)
        )
    except Exception:  # a gap in the columns' parse: the entries go one by one, which decide
        b = None
    if b is not None:
        b.parse_seconds = time.perf_counter() - t0
        return b
    b = Batch(partition)
    kept: list[list] = []  # the fields of the valid events, for their inputs' columns
    for raw_id, entry in entries:
        b.ids.append(raw_id)
        key = entry_id(raw_id)
        if not entry:
            b.lost += 1
            continue
        fields = flat_fields(entry)
        try:
            user, type_, ts, event_id, producer = parse_flat_entry(fields, key[0], max_skew_ms)
            if ahead and ts == key[0] and (problem := id_time_problem(ts, now_ms, max_skew_ms)):
                raise EventError(problem)
        except EventError as exc:
            b.dead.append(DeadLetter(raw_id, str(exc), fields))
            continue
        except Exception as exc:  # a parser gap must cost one dead letter, not the worker
            error = f"unparseable entry ({type(exc).__name__}: {exc})"[:1000]
            b.dead.append(DeadLetter(raw_id, error, fields))
            continue
        if partitions > 1 and (home := partition_of(user, partitions)) != partition:
            error = (f"misrouted: user_id {user!r} belongs to partition {home} of {partitions}, "
                     f"read from partition {partition} (a producer with another partition "
                     "count?)")  # fmt: skip
            b.dead.append(DeadLetter(raw_id, error, fields))
            b.misrouted += 1
            continue
        b.users.append(user)
        b.types.append(type_)
        b.ts.append(ts)
        b.entry_ids.append(raw_id)
        b.entry_keys.append(key)
        b.event_ids.append(event_id)
        b.producers.append(producer)
        if wanted:
            kept.append(fields)
    if wanted:
        b.inputs = raw_inputs(kept, wanted)
    # entry_seconds stays None: the resends stage works them out, for a group once (joint.py)
    b.parse_seconds = time.perf_counter() - t0
    return b
