"""The event schema producers publish (docs/contract.md, Events in), and its parsers.

One `Event` model serves JSON lines (`intentstream score`, `publish`) and Redis stream
entries (the worker); anything that does not fit raises `EventError` with a readable reason,
which the worker writes to the dead-letter stream.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from model.values import value_bytes

MAX_USER_ID_BYTES = 256
MAX_TYPE_BYTES = 128
MAX_EVENT_ID_BYTES = 128
_EVENT_ID = re.compile(rb"[\x21-\x7e]{1,%d}" % MAX_EVENT_ID_BYTES)
# A producer stamp `<producer id>:<sequence>` (worker/common/dedup.py): printable ASCII without
# spaces or colons, then a decimal below 10^18.
MAX_PRODUCER_ID_BYTES = 64
_PRODUCER = re.compile(rb"([\x21-\x39\x3b-\x7e]{1,%d}):([0-9]{1,18})" % MAX_PRODUCER_ID_BYTES)
# Epoch milliseconds up to year 9999: rejects seconds-vs-ms mix-ups far in the future only
# loosely, but keeps every value inside int64 and datetime range.
MAX_TS_MS = 253_402_300_799_999
# The timestamp rule for stream entries, whose id tells when Redis received them
# (docs/producers.md, Timestamps): a ts before 2000 is a unit mix-up (seconds for
# milliseconds), and a ts far ahead of its receipt would hold a user's session open until then.
MIN_TS_MS = 946_684_800_000  # 2000-01-01T00:00:00Z
DEFAULT_MAX_TS_SKEW_MS = 600_000


class EventError(ValueError):
    """An entry or line that is not a valid event; the message says why."""


class Event(BaseModel):
    """A user-behaviour event: who, what, when (epoch ms; None = the entry's own time), and
    optionally the producer's unique id of it (a retried publish repeats it)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    user_id: str
    type: str
    ts: int | None = None
    event_id: str | None = None
    producer: str | None = None  # `<producer id>:<sequence>`, stamped by publish()

    @field_validator("user_id", "event_id", mode="before")
    @classmethod
    def _integer_as_digits(cls, v: object) -> object:
        # Shops' exports often number their users (REES46's user_id): in JSON an integer id
        # is its digits, as a stream entry carries it. A float or a boolean is no id.
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("user_id")
    @classmethod
    def _user_id_size(cls, v: str) -> str:
        n = len(v.encode("utf-8"))
        if not 1 <= n <= MAX_USER_ID_BYTES:
            raise ValueError(f"must be 1-{MAX_USER_ID_BYTES} bytes of UTF-8, got {n}")
        return v

    @field_validator("type")
    @classmethod
    def _type_size(cls, v: str) -> str:
        n = len(v.encode("utf-8"))
        if not 1 <= n <= MAX_TYPE_BYTES:
            raise ValueError(f"must be 1-{MAX_TYPE_BYTES} bytes of UTF-8, got {n}")
        return v

    @field_validator("event_id")
    @classmethod
    def _event_id_printable(cls, v: str | None) -> str | None:
        # Printable ASCII without spaces: ids travel space-separated to the commit script.
        if v is not None and not _EVENT_ID.fullmatch(v.encode("utf-8")):
            raise ValueError(
                f"must be 1-{MAX_EVENT_ID_BYTES} printable ASCII characters without spaces"
            )
        return v

    @field_validator("producer")
    @classmethod
    def _producer_stamp(cls, v: str | None) -> str | None:
        if v is not None and not _PRODUCER.fullmatch(v.encode("utf-8")):
            raise ValueError(
                "must be <producer id>:<sequence> (1-64 printable ASCII characters without "
                "spaces or colons, then 1-18 digits)"
            )
        return v

    @field_validator("ts", mode="before")
    @classmethod
    def _ts_integer_ms(cls, v: object) -> object:
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, str)):
            raise ValueError("must be an integer number of epoch milliseconds")
        if isinstance(v, str):
            if not v.isascii() or not v.isdigit():
                raise ValueError(f"must be an integer number of epoch milliseconds, got {v!r}")
            v = int(v)
        if not 0 <= v <= MAX_TS_MS:
            raise ValueError(f"must be between 0 and {MAX_TS_MS} epoch milliseconds")
        return v


def _reason(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors():
        where = ".".join(str(p) for p in e["loc"]) or "event"
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}")
    return "; ".join(parts)


def event_from_mapping(doc: object) -> Event:
    """Validate a decoded JSON object (or field mapping) as an Event."""
    if not isinstance(doc, dict):
        raise EventError(f"expected a JSON object, got {type(doc).__name__}")
    try:
        return Event.model_validate(doc)
    except ValidationError as exc:
        raise EventError(_reason(exc)) from None


# An event mapping's own fields as publish() reads them: user_id, type, ts, event_id, producer
EventFields = tuple[str, str, int | None, str | None, str | None]


def fast_event(doc: Mapping) -> EventFields | None:
    """An event mapping's own fields when they are obviously valid (ASCII text within the
    bounds, an integer ts in range, no producer stamp), else None: `event_from_mapping`
    then decides, and names the reason. The producer's per-event path: pydantic costs
    ~10 µs an event, most of a bulk publish's Python. Tests check both agree."""
    uid, typ = doc.get("user_id"), doc.get("type")
    if type(uid) is not str or type(typ) is not str or doc.get("producer") is not None:
        return None
    if not (uid.isascii() and typ.isascii()):
        return None  # a string's bytes are its length only in ASCII
    if not (0 < len(uid) <= MAX_USER_ID_BYTES and 0 < len(typ) <= MAX_TYPE_BYTES):
        return None
    ts, eid = doc.get("ts"), doc.get("event_id")
    if ts is not None and (type(ts) is not int or not 0 <= ts <= MAX_TS_MS):
        return None
    if eid is not None and (
        type(eid) is not str or not eid.isascii() or not _EVENT_ID.fullmatch(eid.encode())
    ):
        return None
    return uid, typ, ts, eid, None


def event_from_json(line: str | bytes) -> Event:
    """Parse one JSON line (an object with user_id, type and optional ts)."""
    try:
        doc = json.loads(line)
    except RecursionError:
        raise EventError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, over-long integers
        raise EventError(f"not valid JSON: {exc}") from None
    return event_from_mapping(doc)


def numbered_events(
    lines: Iterable[str], on_error: Callable[[int, EventError], None]
) -> Iterator[Event | None]:
    """Parse JSON lines in order; a bad line calls on_error(line number, error) and yields
    None, so callers can count it and keep their output in input order. Blank lines skip."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield event_from_json(line)
        except EventError as exc:
            on_error(number, exc)
            yield None


_FIELDS = (b"user_id", b"type", b"ts", b"event_id", b"producer")


def _decode_field(name: bytes, value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise EventError(f"{name.decode()}: not valid UTF-8") from None


def ts_problem(ts: int, entry_ms: int, max_skew_ms: int) -> str | None:
    """Why a stream entry's event time breaks the timestamp rule, or None when it holds.

    A `ts` must be from 2000 on and at most `max_skew_ms` ahead of the entry id's time; an
    entry without `ts` takes its id's time, which must fit in epoch milliseconds."""
    if ts == entry_ms:  # no ts given (or the same): the id's time, range-checked only
        if ts > MAX_TS_MS:
            return f"the entry id's time {entry_ms} ms is past year 9999 and no ts is given"
        return None
    if ts < MIN_TS_MS:
        return f"ts: {ts} is before 2000-01-01 (epoch milliseconds expected, not seconds)"
    if ts - entry_ms > max_skew_ms:
        return (
            f"ts: {ts} is {ts - entry_ms} ms ahead of the entry id's time {entry_ms}; "
            f"at most {max_skew_ms} ms allowed (max-ts-skew-ms)"
        )
    return None


def event_from_fields(fields: dict[bytes, bytes], entry_ms: int) -> Event:
    """Parse a stream entry's fields: user_id, type, optional ts and event_id, or one `json`
    field holding them.

    An event without ts takes the entry id's time (entry_ms). Other fields are ignored.
    """
    if b"user_id" not in fields and b"json" in fields:
        raw = fields[b"json"]
        if len(raw) > 64 * 1024:
            raise EventError("json: larger than 64 KiB")
        event = event_from_json(raw)
    else:
        doc = {n.decode(): _decode_field(n, fields[n]) for n in _FIELDS if n in fields}
        event = event_from_mapping(doc)
    if event.ts is None:
        return event.model_copy(update={"ts": entry_ms})
    return event


# What the worker keeps of a valid entry: user_id, type, ts (epoch ms), the producer's
# event_id (None when absent), its producer stamp (id, sequence; None when absent). A plain
# tuple: one is made per event.
ParsedEntry = tuple[str, str, int, "bytes | None", "tuple[bytes, int] | None"]


def producer_stamp(raw: bytes | None) -> tuple[bytes, int] | None:
    """A valid producer stamp as (id, sequence)."""
    if raw is None:
        return None
    m = _PRODUCER.fullmatch(raw)
    return (m[1], int(m[2])) if m else None


def _fast(
    uid: bytes, typ: bytes, ts: bytes | None, eid: bytes | None, prod: bytes | None,
    entry_ms: int,
) -> ParsedEntry | None:  # fmt: skip
    """The entry when it is obviously valid, else None (the schema then decides)."""
    if not (0 < len(uid) <= MAX_USER_ID_BYTES and 0 < len(typ) <= MAX_TYPE_BYTES):
        return None
    if eid is not None and not _EVENT_ID.fullmatch(eid):
        return None
    stamp = producer_stamp(prod)
    if prod is not None and stamp is None:
        return None
    try:
        user_id, type_ = uid.decode("utf-8"), typ.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if ts is None:
        return user_id, type_, entry_ms, eid, stamp
    if 0 < len(ts) <= 15 and ts.isdigit() and int(ts) <= MAX_TS_MS:
        return user_id, type_, int(ts), eid, stamp
    return None


def _checked(entry: ParsedEntry, entry_ms: int, max_skew_ms: int) -> ParsedEntry:
    """The entry, if its time keeps the timestamp rule; else EventError."""
    problem = ts_problem(entry[2], entry_ms, max_skew_ms)
    if problem is not None:
        raise EventError(problem)
    return entry


def parse_entry(
    fields: dict[bytes, bytes], entry_ms: int, max_skew_ms: int = DEFAULT_MAX_TS_SKEW_MS
) -> ParsedEntry:
    """The event of a stream entry; raises EventError with the reason.

    The worker's per-entry path: plain field/value entries that are obviously valid skip
    pydantic (~4 µs each); anything else goes through `event_from_fields`, the one
    definition of validity. Tests check both paths agree on arbitrary input. Either way
    the event's time must keep the timestamp rule (`ts_problem`).
    """
    uid, typ = fields.get(b"user_id"), fields.get(b"type")
    if uid is not None and typ is not None:
        get = fields.get
        fast = _fast(uid, typ, get(b"ts"), get(b"event_id"), get(b"producer"), entry_ms)
        if fast is not None:
            return _checked(fast, entry_ms, max_skew_ms)
    event = event_from_fields(fields, entry_ms)
    eid = event.event_id.encode("utf-8") if event.event_id is not None else None
    stamp = producer_stamp(event.producer.encode()) if event.producer is not None else None
    return _checked((event.user_id, event.type, event.ts, eid, stamp), entry_ms, max_skew_ms)


def flat_fields(fields: list | dict) -> list:
    """A stream entry's fields as one flat list [field, value, field, value, ...]: a reply's
    list as it is; the dict a cluster client's reply holds per entry, flattened in order."""
    return fields if isinstance(fields, list) else [x for kv in fields.items() for x in kv]


def parse_flat_entry(
    flat: list[bytes], entry_ms: int, max_skew_ms: int = DEFAULT_MAX_TS_SKEW_MS
) -> ParsedEntry:
    """`parse_entry` for a raw reply's field list [field, value, field, value, ...].

    The layout `publish()` sends (user_id, type[, ts][, event_id][, producer], in that
    order) is checked in place; anything else becomes a dict first (the last of repeated
    fields wins, as in HGETALL).
    """
    n = len(flat)
    if n >= 4 and flat[0] == b"user_id" and flat[2] == b"type":
        # the layouts publish() and most producers send, checked in place
        ts = eid = prod = None
        i = 4
        if i < n and flat[i] == b"ts":
            ts, i = flat[i + 1], i + 2
        if i < n and flat[i] == b"event_id":
            eid, i = flat[i + 1], i + 2
        if i < n and flat[i] == b"producer":
            prod, i = flat[i + 1], i + 2
        if i == n or _only_other_fields(flat, i):
            fast = _fast(flat[1], flat[3], ts, eid, prod, entry_ms)
            if fast is not None:
                return _checked(fast, entry_ms, max_skew_ms)
    return parse_entry(dict(zip(flat[::2], flat[1::2], strict=False)), entry_ms, max_skew_ms)


_EVENT_FIELDS = frozenset(_FIELDS)


def _only_other_fields(flat: list[bytes], i: int) -> bool:
    """Whether the fields from i on are none of the event's own (a declared input's, say):
    the event is then what the fields before i say, whatever follows."""
    return len(flat) % 2 == 0 and _EVENT_FIELDS.isdisjoint(flat[i::2])


# A declared input's value longer than this is not a product id, a brand or a price: read as
# absent (counted by the model as missing), so a crafted entry costs no hashing time.
MAX_INPUT_BYTES = 256


def input_values(flat: list, names: tuple[bytes, ...]) -> list[bytes | None]:
    """The raw values of a model's declared inputs (docs/contract.md, The model) in one
    entry: its fields of those names, else the keys of its `json` object (strings and numbers
    as their text); None where absent, not a scalar, or longer than MAX_INPUT_BYTES."""
    found: dict[bytes, bytes | None] = dict.fromkeys(names)
    doc = None
    for k in range(0, len(flat) - 1, 2):
        name = flat[k]
        if name in found:
            found[name] = flat[k + 1]
        elif name == b"json":
            doc = flat[k + 1]
    if doc is not None and b"user_id" not in flat[::2]:
        found = json_inputs(doc, names)
    return [v if v is not None and len(v) <= MAX_INPUT_BYTES else None for v in found.values()]


def last_json(flat: list) -> bytes:
    """The value of an entry's last `json` field (of a repeated name, the last counts)."""
    keys = flat[::2]
    return flat[2 * (len(keys) - 1 - keys[::-1].index(b"json")) + 1]


def input_picks(keys: tuple, names: tuple[bytes, ...]) -> list[tuple[int, int]] | None:
    """(input, index of its value) for the fields named `keys` (the last of a repeated name
    counts); None when the event is in a `json` field."""
    if b"json" in keys and b"user_id" not in keys:
        return None
    at = {key: 2 * j + 1 for j, key in enumerate(keys)}
    return [(i, at[name]) for i, name in enumerate(names) if name in at]


def json_inputs(raw: bytes, names: tuple[bytes, ...]) -> dict[bytes, bytes | None]:
    """The declared inputs of a `json` field's object (the event's own parse checked it)."""
    try:
        doc = json.loads(raw) if len(raw) <= 64 * 1024 else None
    except ValueError:
        doc = None
    out: dict[bytes, bytes | None] = dict.fromkeys(names)
    if isinstance(doc, dict):
        for name in names:
            out[name] = input_text(doc.get(name.decode("utf-8", "replace")))
    return out


SCALARS = (str, int, float, bool)  # the JSON values a declared input reads; others are absent
_INT_BOUND = 10**MAX_INPUT_BYTES


def input_text(v: object) -> bytes | None:
    """The bytes a JSON value of a declared input stands for in a stream entry, so that the
    worker reads what `score` and training read of the same value: text as UTF-8, numbers
    and booleans as model/values.py's value_bytes writes them; None (absent) for null, an
    empty string, an object or a list."""
    if v is None or not isinstance(v, SCALARS):
        return None
    if isinstance(v, int) and not -_INT_BOUND < v < _INT_BOUND:
        return None  # over the bound as text (and past what str() of an int may print)
    return value_bytes(v) or None


# The event's own fields (docs/contract.md, Events in): never a declared input.
EVENT_FIELDS = frozenset(("user_id", "type", "ts", "event_id", "producer", "json"))
_NOT_INPUTS = frozenset(n.encode() for n in EVENT_FIELDS)


def extra_values(flat: list) -> dict[bytes, bytes]:
    """Every field of an entry beyond the event's own, each a possible declared input: its
    fields, else its `json` object's scalar keys; values over MAX_INPUT_BYTES left out."""
    names = tuple(n for n in flat[::2] if n not in _NOT_INPUTS)
    doc = next((flat[k + 1] for k in range(0, len(flat) - 1, 2) if flat[k] == b"json"), None)
    if doc is not None and b"user_id" not in flat[::2]:
        names = tuple(_json_keys(doc))
    values = input_values(flat, names)
    return {n: v for n, v in zip(names, values, strict=True) if v is not None}


def _json_keys(raw: bytes) -> list[bytes]:
    """The keys of a `json` field's object beyond the event's own ([] when it is none)."""
    try:
        doc = json.loads(raw) if len(raw) <= 64 * 1024 else None
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    keys = (k.encode("utf-8", "replace") for k in doc)
    return [k for k in keys if k not in _NOT_INPUTS]
