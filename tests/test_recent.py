"""A user's packed history (compute/recent.py) with the declared inputs' stored values: pack and
unpack round trips, the layout before inputs, and extensions checked against their definition."""

from __future__ import annotations

import itertools
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from model.inputs import parse_inputs
from worker.engine.compute.histories import extended_histories, holding, valid_histories
from worker.engine.compute.recent import (
    HASH,
    NUMBER,
    Recent,
    column_bytes,
    extend_packed,
    extend_with_inputs,
    extended,
    field_key,
    has,
    names_of,
    pack,
    unpack,
    valid,
)

PRICE, BRAND = (NUMBER, "price"), (HASH, "brand")


def old_layout(prev_ts: int, ts: list[int], types: list[str]) -> bytes:
    """A `recent` field as written before inputs: head, times, names (no section)."""
    names = b"".join(bytes([len(t.encode())]) + t.encode() for t in types)
    return struct.pack(f"<qH{len(ts)}q", prev_ts, len(ts), *ts) + names


def test_a_history_with_inputs_round_trips():
    columns = {PRICE: np.array([2.5, np.nan, np.inf]), BRAND: np.array([7, -1, 2**32 - 1])}
    recent = Recent.of(500, [1000, 2000, 3000], ["view", "ü-type", "buy"], columns)
    back = unpack(pack(recent))
    assert back == recent and back.fields == [PRICE, BRAND]
    np.testing.assert_array_equal(back.column(*PRICE), columns[PRICE])
    assert back.column(*BRAND).tolist() == [7, -1, 2**32 - 1]
    assert back.column(HASH, "price") is None  # keyed by form and name


def test_each_input_costs_8_bytes_an_event_and_its_header():
    ts, types = list(range(1000, 33000, 1000)), ["view"] * 32
    bare = len(pack(Recent.of(-1, ts, types)))
    rich = len(pack(Recent.of(-1, ts, types, {PRICE: np.zeros(32), BRAND: np.zeros(32)})))
    assert rich - bare == 1 + (2 + 5) * 2 + 2 * 8 * 32


def test_the_layout_before_inputs_reads_as_a_history_without_them():
    raw = old_layout(500, [1000, 2000], ["view", "search"])
    assert unpack(raw) == Recent.of(500, [1000, 2000], ["view", "search"])
    assert pack(unpack(raw)) == raw  # and a history without inputs is still written so
    specs = parse_inputs([{"kind": "numeric", "name": "price", "transform": "none",
                           "mean": 0.0, "scale": 1.0}])  # fmt: skip
    (stored,) = unpack(raw).stored_inputs(list(specs)).values()
    assert np.isnan(stored.values).all() and len(stored) == 2


def test_old_events_hold_a_field_first_given_with_new_ones_absent():
    raw = old_layout(500, [1000, 2000], ["view", "search"])
    new = {field_key(*PRICE): struct.pack("<d", 9.5)}
    got = unpack(extend_with_inputs(raw, [3000], names_of(["buy"]), 32, 0.0, new))
    assert got.ts == [1000, 2000, 3000] and got.types == ["view", "search", "buy"]
    assert np.isnan(got.column(*PRICE)[:2]).all() and got.column(*PRICE)[2] == 9.5


def test_a_field_no_scoring_model_declares_is_dropped():
    recent = Recent.of(-1, [1000], ["view"], {PRICE: np.array([1.0]), BRAND: np.array([3])})
    only_brand = extended(recent, [2000], ["buy"], 32, 0.0, {BRAND: np.array([4])})
    assert only_brand.fields == [BRAND] and only_brand.column(*BRAND).tolist() == [3, 4]
    type_only = extended(recent, [2000], ["buy"], 32, 0.0)
    assert type_only == Recent.of(-1, [1000, 2000], ["view", "buy"])


def test_a_malformed_input_section_reads_as_no_history():
    good = pack(Recent.of(-1, [1000, 2000], ["a", "b"], {PRICE: np.array([1.0, 2.0])}))
    head = struct.calcsize("<qH") + 16
    assert unpack(good[:-3]) == Recent()  # truncated
    bad_form = good[: head + 1] + b"\x07" + good[head + 2 :]
    assert unpack(bad_form) == Recent()
    assert unpack(good + b"x") == Recent()


def test_extension_with_inputs_matches_its_definition_on_random_histories():
    """The times, types and every field's values are those of the kept events (the
    definition of test_pipeline's type-only check), whatever the old and new field sets."""
    rng = np.random.default_rng(6)
    fields = [PRICE, BRAND, (HASH, "product")]
    for _ in range(500):
        n_old, n_new = int(rng.integers(0, 6)), int(rng.integers(1, 6))
        old_ts = np.cumsum(rng.integers(0, 100, n_old)).tolist()
        new_ts = (np.cumsum(rng.integers(0, 100, n_new)) + (old_ts[-1] if old_ts else 0)).tolist()
        old_f = [f for f in fields if rng.random() < 0.5]
        new_f = [f for f in fields if rng.random() < 0.5]
        values = {f: rng.integers(-1, 50, n_old + n_new).astype(np.float64) for f in fields}
        old_cols = {f: values[f][:n_old] if f[0] == NUMBER else values[f][:n_old].astype(np.int64)
                    for f in old_f}  # fmt: skip
        new_cols = {f: values[f][n_old:] for f in new_f}
        keep, gap = int(rng.integers(1, 8)), float(rng.choice([0, 30, 60]))
        old = Recent.of(-1, old_ts, ["o"] * n_old, old_cols)
        got = extended(old, new_ts, ["n"] * n_new, keep, gap, new_cols)
        plain = extended(Recent.of(-1, old_ts, ["o"] * n_old), new_ts, ["n"] * n_new, keep, gap)
        assert (got.prev_ts, got.ts, got.types) == (plain.prev_ts, plain.ts, plain.types)
        start = n_old + n_new - len(got)
        assert got.fields == new_f
        for f in new_f:
            want = values[f][start:].copy()
            if f not in old_f:  # the old events did not hold it
                want[: max(n_old - start, 0)] = np.nan if f[0] == NUMBER else -1
            np.testing.assert_array_equal(got.column(*f), want)


FIELDS = [PRICE, BRAND, (HASH, "product"), (NUMBER, "brand")]
TIMES = st.one_of(
    st.lists(st.integers(0, 100), max_size=6).map(lambda d: np.cumsum(d).tolist()),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6),  # gaps that overflow int64
)
VALUES = {
    NUMBER: st.floats(allow_nan=True, allow_infinity=True),
    HASH: st.one_of(st.integers(-1, 2**32 - 1), st.integers(-(2**63), 2**63 - 1)),
}
TYPES = st.text(st.characters(codec="utf-8"), max_size=6)


@st.composite
def raw_field(draw) -> bytes:
    """A `recent` field as Redis may hold it: none, the layout before inputs, a section (any
    fields, repeated or none), or bytes broken from one of these."""
    ts = draw(TIMES)
    types = draw(st.lists(TYPES, min_size=len(ts), max_size=len(ts)))
    prev = draw(st.integers(-(2**63), 2**63 - 1))
    kind = draw(st.sampled_from(["none", "old", "section", "broken"]))
    if kind == "none":
        return b""
    if kind == "old":
        return old_layout(prev, ts, types)
    keys = draw(st.lists(st.sampled_from(FIELDS), max_size=4))  # a key may repeat
    columns = [column_bytes(f[0], np.array(draw(st.lists(VALUES[f[0]], min_size=len(ts),
                                                         max_size=len(ts))), _dtype(f)))
               for f in keys]  # fmt: skip
    raw = (struct.pack(f"<qH{len(ts)}q", prev, len(ts) | 0x8000, *ts)
           + bytes([len(keys)]) + b"".join(field_key(*f) for f in keys) + b"".join(columns)
           + b"".join(names_of(types)))  # fmt: skip
    if kind == "broken":
        cut = draw(st.integers(0, len(raw)))
        raw = draw(st.sampled_from([raw[:cut], raw[:cut] + bytes([draw(st.integers(0, 255))])
                                    + raw[cut + 1 :], raw + b"x"]))  # fmt: skip
    return raw


def stored_field():
    """A `recent` field through `valid`, as the states' reader passes it."""
    return raw_field().map(valid)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(raw_field(), st.binary(max_size=40), st.none()), max_size=8))
def test_the_batched_validation_keeps_exactly_what_valid_keeps(raws):
    assert valid_histories(raws) == [valid(raw) for raw in raws]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(raw_field(), st.binary(max_size=40)), max_size=8), st.data())
def test_the_batched_type_check_is_has(raws, data):
    held = [t for raw in raws for t in unpack(raw).types]  # a type they hold, or another
    type_ = data.draw(st.sampled_from(held) if held and data.draw(st.booleans()) else TYPES)
    assert holding(raws, type_) == [has(raw, type_) for raw in raws]


def test_names_that_are_not_utf8_as_python_decodes_it_read_as_no_history():
    for name in (b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", b"\xff",
                 b"\xe2\x82", b"ok\xc3\xa9", "\U0010ffff".encode(), b"\xef\xbf\xbf"):  # fmt: skip
        raw = struct.pack("<qHq", -1, 1, 5) + bytes([len(name)]) + name
        assert valid_histories([raw]) == [valid(raw)], name


def _dtype(f):
    return np.float64 if f[0] == NUMBER else np.int64


@st.composite
def batch_of(draw):
    """Users' stored histories (maybe none) and a batch of new events (each user at least
    one), in an interleaved order, with the stored values of some fields."""
    old = draw(st.lists(stored_field(), min_size=0, max_size=5))
    counts = draw(st.lists(st.integers(1, 5), min_size=len(old), max_size=len(old)))
    slot = np.array(draw(st.permutations(np.repeat(np.arange(len(old)), counts).tolist())), int)
    n = len(slot)
    start = draw(st.integers(-(2**63) + 1, 2**63 - 1 - 10**6))
    wide = draw(st.booleans())
    steps = draw(st.lists(st.integers(-(2**62) if wide else 0, 2**62 if wide else 100),
                          min_size=n, max_size=n))  # fmt: skip
    ts = np.array([min(max(start + s, -(2**63)), 2**63 - 1)
                   for s in itertools.accumulate(steps)], np.int64)  # fmt: skip
    types = draw(st.lists(TYPES, min_size=n, max_size=n))
    fields = draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=3))
    columns = {f: np.array(draw(st.lists(VALUES[f[0]], min_size=n, max_size=n)), _dtype(f))
               for f in fields}  # fmt: skip
    keep = draw(st.integers(1, 12))
    gap = draw(st.sampled_from([0.0, -5.0, 0.5, 30.0, 60.7, 2.0**63, 2.0**64, 1e300,
                                float("inf"), float("nan")]))  # fmt: skip
    return old, slot, ts, types, keep, gap, columns


@settings(max_examples=400, deadline=None)
@given(batch_of())
def test_the_batched_extension_writes_the_bytes_of_the_per_user_one(case):
    """One kernel call for the batch's users gives each user's field as extend_packed (no
    inputs) or extend_with_inputs gives it, whatever the stored fields and the gaps."""
    old, slot, ts, types, keep, gap, columns = case
    got = extended_histories(old, slot, ts, types, keep, gap, columns)
    for u, raw in enumerate(old):
        mine = np.flatnonzero(slot == u)
        t, names = ts[mine].tolist(), names_of([types[i] for i in mine])
        if not columns:
            want = extend_packed(raw, t, names, keep, gap)
        else:
            new = {field_key(*f): column_bytes(f[0], v[mine]) for f, v in columns.items()}
            want = extend_with_inputs(raw, t, names, keep, gap, new)
        assert got[u] == want


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True),
    st.sampled_from(["same", "reordered", "fewer", "more"]),
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.integers(1, 12),
)
def test_a_batch_with_the_histories_fields_extends_them_as_the_per_user_one(
    fields, change, counts, keep
):
    """The usual case, the fields of the batch before (the kernel's shortcut), and the ones
    next to it that must not take it: the same fields reordered, fewer or more."""
    rng = np.random.default_rng(len(fields) + 7 * keep)
    slot = np.repeat(np.arange(len(counts)), counts)
    ts = np.arange(len(slot), dtype=np.int64) * 1000

    def columns(fs):
        return {f: (rng.random(len(slot)) if f[0] == NUMBER
                    else rng.integers(-1, 2**32, len(slot))) for f in fs}  # fmt: skip

    old = extended_histories([b""] * len(counts), slot, ts, ["v"] * len(slot), keep, 0.0,
                             columns(fields))  # fmt: skip
    others = [f for f in FIELDS if f not in fields][:1]
    new = columns({"same": fields, "reordered": fields[::-1], "fewer": fields[:-1],
                   "more": [*fields, *others]}[change])  # fmt: skip
    got = extended_histories(old, slot, ts + 10**6, ["w"] * len(slot), keep, 0.0, new)
    for u, raw in enumerate(old):
        mine = np.flatnonzero(slot == u)
        t, names = (ts[mine] + 10**6).tolist(), names_of(["w"] * len(mine))
        held = {field_key(*f): column_bytes(f[0], v[mine]) for f, v in new.items()}
        want = (extend_with_inputs(raw, t, names, keep, 0.0, held) if held
                else extend_packed(raw, t, names, keep, 0.0))  # fmt: skip
        assert got[u] == want
