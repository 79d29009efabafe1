"""Event parsing: the fast path agrees with the pydantic schema on arbitrary input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.events import MAX_TS_MS, EventError, event_from_fields, parse_entry, parse_flat_entry

NAMES = st.sampled_from([b"user_id", b"type", b"ts", b"event_id", b"json", b"other"]) | st.binary(
    max_size=8
)
VALUES = (
    st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | st.integers(-(10**16), 10**16).map(lambda i: str(i).encode())
    | st.sampled_from([b"view", b"alice", b"", b"1700000000000", b"12.5", b"\xff", b"e 1", b"e-1"])
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


def outcome(fn, fields):
    try:
        return fn(fields)
    except EventError as exc:
        return ("error", str(exc))


@settings(max_examples=400, deadline=None)
@given(fields=st.dictionaries(NAMES, VALUES, max_size=5), entry_ms=st.integers(0, MAX_TS_MS))
def test_fast_parser_agrees_with_the_schema_on_arbitrary_fields(fields, entry_ms):
    fast = outcome(lambda f: parse_entry(f, entry_ms), fields)
    slow = outcome(lambda f: event_from_fields(f, entry_ms), fields)
    if isinstance(slow, tuple) and slow[0] == "error":
        assert fast == slow  # same rejection, same reason
    else:
        eid = slow.event_id.encode() if slow.event_id is not None else None
        assert fast == (slow.user_id, slow.type, slow.ts, eid)
        assert 1 <= len(slow.user_id.encode()) <= 256
        assert 0 <= slow.ts <= MAX_TS_MS


@settings(max_examples=200, deadline=None)
@given(
    doc=st.dictionaries(st.sampled_from(["user_id", "type", "ts", "x"]), JSON_VALUES, max_size=4)
)
def test_json_field_never_raises_anything_but_event_error(doc):
    import json

    fields = {b"json": json.dumps(doc).encode()}
    result = outcome(lambda f: parse_entry(f, 5), fields)
    if not (isinstance(result, tuple) and result[0] == "error"):
        user_id, type_, _ts, _event_id = result
        assert user_id == doc["user_id"] and type_ == doc["type"]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({b"user_id": b"a", b"type": b"view"}, ("a", "view", 42, None)),
        ({b"user_id": b"a", b"type": b"view", b"ts": b"7"}, ("a", "view", 7, None)),
        ({b"json": b'{"user_id": "a", "type": "view", "ts": 9}'}, ("a", "view", 9, None)),
        ({b"json": b'{"user_id": "a", "type": "view"}'}, ("a", "view", 42, None)),
        ({b"user_id": "ü".encode(), b"type": b"view", b"x": b"\xff"}, ("ü", "view", 42, None)),
        ({b"user_id": b"a", b"type": b"v", b"event_id": b"o-1"}, ("a", "v", 42, b"o-1")),
        ({b"json": b'{"user_id": "a", "type": "v", "event_id": "o-2"}'}, ("a", "v", 42, b"o-2")),
    ],
)
def test_valid_entries(fields, expected):
    assert parse_entry(fields, 42) == expected


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({b"type": b"view"}, "user_id: Field required"),
        ({b"user_id": b"a", b"type": b"view", b"ts": b"1e3"}, "ts: must be an integer"),
        (
            {b"user_id": b"a", b"type": b"view", b"ts": str(MAX_TS_MS + 1).encode()},
            "ts: must be between",
        ),
        ({b"user_id": b"a" * 257, b"type": b"view"}, "user_id: must be 1-256 bytes"),
        ({b"json": b"x" * 70000}, "json: larger than 64 KiB"),
        ({b"json": b'{"user_id": "a", "type": "v", "ts": true}'}, "ts: must be an integer"),
        ({b"user_id": b"a", b"type": b"v", b"event_id": b"has space"}, "event_id: must be"),
        ({b"user_id": b"a", b"type": b"v", b"event_id": b"x" * 129}, "event_id: must be"),
    ],
)
def test_invalid_entries_name_the_problem(fields, reason):
    with pytest.raises(EventError, match=reason):
        parse_entry(fields, 0)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(st.tuples(NAMES, VALUES), max_size=5),
    entry_ms=st.integers(0, MAX_TS_MS),
)
def test_flat_field_lists_parse_like_their_dict(pairs, entry_ms):
    flat = [x for kv in pairs for x in kv]
    as_dict = dict(pairs)  # the last of repeated fields wins, as in the flat parser
    want = outcome(lambda f: parse_entry(f, entry_ms), as_dict)
    assert outcome(lambda f: parse_flat_entry(f, entry_ms), flat) == want


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({b"json": b"[" * 20_000}, "nested too deeply"),
        (
            {b"json": b'{"user_id": "a", "type": "v", "ts": 1' + b"0" * 5000 + b"}"},
            "not valid JSON",
        ),
    ],
)
def test_hostile_json_is_an_event_error_not_a_crash(fields, reason):
    with pytest.raises(EventError, match=reason):
        parse_entry(fields, 0)


def test_a_parser_gap_becomes_a_dead_letter(monkeypatch):
    from worker import batch

    def broken(fields, ms):
        raise RuntimeError("surprise")

    monkeypatch.setattr(batch, "parse_flat_entry", broken)
    parsed = batch.parse_batch(0, [[b"1-0", [b"user_id", b"a", b"type", b"v"]]])
    assert parsed.users == [] and len(parsed.dead) == 1
    assert parsed.dead[0].error == "unparseable entry (RuntimeError: surprise)"
