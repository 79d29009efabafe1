"""Event parsing: the fast path agrees with the pydantic schema on arbitrary input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.events import (
    DEFAULT_MAX_TS_SKEW_MS as SKEW,
)
from worker.common.events import (
    MAX_TS_MS,
    EventError,
    event_from_fields,
    event_from_mapping,
    extra_values,
    fast_event,
    input_values,
    parse_entry,
    parse_flat_entry,
    ts_problem,
)

T7 = 1_700_000_000_007  # a plausible event time (epoch ms)

NAMES = st.sampled_from(
    [b"user_id", b"type", b"ts", b"event_id", b"producer", b"json", b"other"]
) | st.binary(max_size=8)
VALUES = (
    st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | st.integers(-(10**16), 10**16).map(lambda i: str(i).encode())
    | st.sampled_from(
        [
            b"view",
            b"alice",
            b"",
            b"1700000000000",
            b"12.5",
            b"\xff",
            b"e 1",
            b"e-1",
            b"p:1",
            b"ab12:99",
            b"p:x",
            b"a:b:3",
            b":4",
            b"p:" + b"9" * 19,
        ]
    )
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=8,
)


MAPPING_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**16), 10**16)
    | st.integers(MAX_TS_MS - 2, MAX_TS_MS + 2)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=70)
    | st.binary(max_size=8)
    | st.sampled_from(["view", "alice", "", " ", "e 1", "e-1", "p:1", "é", "a" * 256, "a" * 257])
)


@settings(max_examples=500, deadline=None)
@given(
    doc=st.dictionaries(
        st.sampled_from(["user_id", "type", "ts", "event_id", "producer", "json", "price"]),
        MAPPING_VALUES,
        max_size=7,
    )
)
def test_the_publishers_fast_path_agrees_with_the_schema_on_arbitrary_mappings(doc):
    """What `fast_event` takes, the schema takes as the same event; what it leaves to the
    schema may be valid or not (the schema says why)."""
    fast = fast_event(doc)
    if fast is None:
        return
    event = event_from_mapping(doc)  # never raises on what the fast path took
    assert fast == (event.user_id, event.type, event.ts, event.event_id, event.producer)


def test_the_publishers_fast_path_takes_a_plain_event_and_leaves_the_rest():
    plain = {"user_id": "u1", "type": "view", "ts": T7, "event_id": "e-1", "price": 3.5}
    assert fast_event(plain) == ("u1", "view", T7, "e-1", None)
    assert fast_event({"user_id": "u1", "type": "view"}) == ("u1", "view", None, None, None)
    for other in ({"user_id": 7}, {"ts": "1700000000000"}, {"ts": True}, {"user_id": "é"},
                  {"event_id": "e 1"}, {"producer": "p:1"}, {"type": ""}):  # fmt: skip
        assert fast_event(plain | other) is None, other


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
    if not isinstance(slow, tuple) and (problem := ts_problem(slow.ts, entry_ms, SKEW)):
        slow = ("error", problem)  # valid by the schema, refused by the timestamp rule
    if isinstance(slow, tuple) and slow[0] == "error":
        assert fast == slow  # same rejection, same reason
    else:
        eid = slow.event_id.encode() if slow.event_id is not None else None
        stamp = None
        if slow.producer is not None:
            pid, _, seq = slow.producer.encode().rpartition(b":")
            stamp = (pid, int(seq))
        assert fast == (slow.user_id, slow.type, slow.ts, eid, stamp)
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
        user_id, type_, _ts, _event_id, _producer = result
        as_id = doc["user_id"]  # an integer id is its digits
        if isinstance(as_id, int) and not isinstance(as_id, bool):
            as_id = str(as_id)
        assert user_id == as_id and type_ == doc["type"]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({b"user_id": b"a", b"type": b"view"}, ("a", "view", 42, None)),
        ({b"user_id": b"a", b"type": b"view", b"ts": b"%d" % T7}, ("a", "view", T7, None)),
        ({b"json": b'{"user_id": "a", "type": "view", "ts": %d}' % T7}, ("a", "view", T7, None)),
        ({b"json": b'{"user_id": "a", "type": "view"}'}, ("a", "view", 42, None)),
        ({b"user_id": "ü".encode(), b"type": b"view", b"x": b"\xff"}, ("ü", "view", 42, None)),
        ({b"user_id": b"a", b"type": b"v", b"event_id": b"o-1"}, ("a", "v", 42, b"o-1")),
        ({b"json": b'{"user_id": "a", "type": "v", "event_id": "o-2"}'}, ("a", "v", 42, b"o-2")),
        ({b"json": b'{"user_id": 512, "type": "v", "event_id": 7}'}, ("512", "v", 42, b"7")),
    ],
)
def test_valid_entries(fields, expected):
    # an entry without ts takes its id's time (42 here: ids may be set by hand)
    assert parse_entry(fields, 42 if expected[2] == 42 else T7 + 5) == (*expected, None)


@pytest.mark.parametrize(
    ("value", "stamp"),
    [
        (b"3f2a:17", (b"3f2a", 17)),
        (b"a-b.c_d:0", (b"a-b.c_d", 0)),
        (b"x" * 64 + b":1", (b"x" * 64, 1)),
    ],
)
def test_producer_stamps(value, stamp):
    fields = {b"user_id": b"a", b"type": b"v", b"producer": value}
    assert parse_entry(fields, 42) == ("a", "v", 42, None, stamp)
    assert parse_flat_entry([b"user_id", b"a", b"type", b"v", b"producer", value], 42)[4] == stamp


@pytest.mark.parametrize(
    "value", [b"nocolon", b"a:b:3", b":4", b"p:-1", b"p:1x", b"x" * 65 + b":1"]
)
def test_a_malformed_producer_stamp_is_an_error(value):
    with pytest.raises(EventError, match="producer: must be <producer id>:<sequence>"):
        parse_entry({b"user_id": b"a", b"type": b"v", b"producer": value}, 42)


NOW = 1_764_000_000_000  # an entry id's time: late 2025


@pytest.mark.parametrize(
    ("ts", "entry_ms", "reason"),
    [
        (1_764_000_000, NOW, "before 2000-01-01 .*not seconds"),  # seconds, not ms
        (0, NOW, "before 2000-01-01"),
        (NOW + SKEW + 1, NOW, f"ahead of the entry id's time {NOW}; at most {SKEW} ms"),
        (MAX_TS_MS, NOW, "ahead of the entry id's time"),
    ],
)
def test_the_timestamp_rule_refuses_a_ts_far_from_its_entry(ts, entry_ms, reason):
    for fields in ({b"user_id": b"u", b"type": b"view", b"ts": b"%d" % ts},
                   {b"json": b'{"user_id": "u", "type": "view", "ts": %d}' % ts}):  # fmt: skip
        with pytest.raises(EventError, match=reason):
            parse_entry(fields, entry_ms)


def test_the_timestamp_rule_keeps_late_and_slightly_early_events():
    for ts in (946_684_800_000, NOW - 86_400_000 * 365, NOW + SKEW):
        assert parse_entry({b"user_id": b"u", b"type": b"v", b"ts": b"%d" % ts}, NOW)[2] == ts
    # the skew is a setting
    late = {b"user_id": b"u", b"type": b"v", b"ts": b"%d" % (NOW + 3_600_000)}
    assert parse_entry(late, NOW, max_skew_ms=3_600_000)[2] == NOW + 3_600_000


@pytest.mark.parametrize("entry_ms", [2**63, 2**64 - 1, MAX_TS_MS + 1])
def test_an_entry_id_past_the_epoch_ms_range_without_ts_is_refused(entry_ms):
    with pytest.raises(EventError, match="past year 9999 and no ts is given"):
        parse_entry({b"user_id": b"m", b"type": b"view"}, entry_ms)
    # with a ts of its own, the event keeps that time
    assert parse_entry({b"user_id": b"m", b"type": b"view", b"ts": b"%d" % NOW}, entry_ms)[2] == NOW


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
    from worker.engine.compute import batch

    def broken(*args):
        raise RuntimeError("surprise")

    monkeypatch.setattr(batch, "parse_flat_entry", broken)
    monkeypatch.setattr(batch, "parsed_columns", broken)  # the batch's columns first
    parsed = batch.parse_batch(0, [[b"1-0", [b"user_id", b"a", b"type", b"v"]]])
    assert parsed.users == [] and len(parsed.dead) == 1
    assert parsed.dead[0].error == "unparseable entry (RuntimeError: surprise)"


def test_input_values_come_from_fields_or_the_json_object_and_are_bounded():
    names = (b"price", b"brand", b"product_id")
    flat = [b"user_id", b"u1", b"type", b"view", b"price", b"9.5", b"brand", b"x" * 257]
    assert input_values(flat, names) == [b"9.5", None, None]  # too long: absent
    doc = {"user_id": "u1", "type": "view", "price": 9.5, "brand": "acme",
           "product_id": {"nested": 1}}  # fmt: skip
    assert input_values([b"json", json.dumps(doc).encode()], names) == [b"9.5", b"acme", None]
    assert input_values([b"json", b"not json"], names) == [None, None, None]


def test_extra_values_are_every_field_beyond_the_events_own():
    flat = [b"user_id", b"u1", b"type", b"view", b"ts", b"1", b"producer", b"p:1",
            b"price", b"9.5", b"big", b"x" * 300]  # fmt: skip
    assert extra_values(flat) == {b"price": b"9.5"}
    doc = {"user_id": "u1", "type": "view", "event_id": "e1", "brand": "acme", "n": 3,
           "flag": None, "tags": ["a"]}  # fmt: skip
    assert extra_values([b"json", json.dumps(doc).encode()]) == {b"brand": b"acme", b"n": b"3"}


@settings(max_examples=300, deadline=None)
@given(
    head=st.lists(VALUES, min_size=3, max_size=3),
    extra=st.lists(
        st.tuples(NAMES | st.sampled_from([b"price", b"product_id"]), VALUES), max_size=4
    ),
    entry_ms=st.integers(0, MAX_TS_MS),
)
def test_the_publish_layout_with_more_fields_parses_like_its_dict(head, extra, entry_ms):
    flat = [b"user_id", head[0], b"type", head[1], b"ts", head[2], *(x for kv in extra for x in kv)]
    as_dict = dict(zip(flat[::2], flat[1::2], strict=True))
    want = outcome(lambda f: parse_entry(f, entry_ms), as_dict)
    assert outcome(lambda f: parse_flat_entry(f, entry_ms), flat) == want


def test_an_entry_without_ts_whose_id_is_ahead_of_the_clock_is_dead_lettered(monkeypatch):
    """The timestamp rule for entry ids (issue 44): an explicit id past the allowed skew,
    without `ts`, is dead-lettered as the same time in `ts` would be; within the skew, or
    with a `ts` of its own, it is kept."""
    from worker.engine.compute import batch as batch_module
    from worker.engine.compute.batch import parse_batch

    now = 1_800_000_000_000
    fields = [b"user_id", b"a", b"type", b"view"]
    far = [b"9999999999999-0", fields]
    near = [b"%d-0" % (now + 600_000), fields]
    with_ts = [b"9999999999999-1", [*fields, b"ts", b"%d" % now]]
    b = parse_batch(0, [near, far, with_ts], now_ms=now)
    assert [d.source_id for d in b.dead] == [b"9999999999999-0"]
    assert "ahead of the clock" in b.dead[0].error and "max-ts-skew-ms" in b.dead[0].error
    assert b.ids == [near[0], far[0], with_ts[0]] and len(b.users) == 2
    monkeypatch.setattr(batch_module, "COLUMNS_FROM", 0)  # the columns even for one entry
    assert not parse_batch(0, [near], now_ms=now).dead  # columnar path, within the skew
    assert len(parse_batch(0, [far], now_ms=now, max_skew_ms=10**14).dead) == 0
