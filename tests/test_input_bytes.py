"""The declared inputs' stored forms straight from the reply's bytes (model/input_bytes.py,
worker/engine/compute/input_fields.py) against their definitions: `input_values` for the
values an entry holds, `numeric_values` and `value_hashes` for their stored forms. Floats are
compared by their bits (NaN, -0.0)."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from model.input_bytes import RawInputs, stored_forms
from model.input_encoding import numeric_values
from model.value_hash import value_hashes
from worker.common.events import MAX_INPUT_BYTES, input_values
from worker.engine.compute.input_fields import raw_inputs

NAMES = (b"price", b"brand", b"product_id")
DECIMALS = st.builds(
    lambda sign, whole, frac: (sign + whole + (f".{frac}" if frac is not None else "")).encode(),
    st.sampled_from(["", "-", "+"]),
    st.text("0123456789", min_size=0, max_size=17),
    st.none() | st.text("0123456789", max_size=17),
)
ODD_NUMBERS = [b"", b"nan", b"inf", b"-inf", b" 1", b"1 ", b"1_0", b"1e3", b"0x10", b".5", b"5.",
               b"-", b".", b"\xff", b"1.2.3", b"\xd9\xa3"]  # fmt: skip
NUMBERS = (
    DECIMALS
    | st.floats(allow_nan=False).map(lambda f: repr(f).encode())
    | st.floats(0, 1e6).map(lambda f: f"{f:.2f}".encode())
    | st.integers(-(10**20), 10**20).map(lambda i: str(i).encode())
    | st.sampled_from(ODD_NUMBERS)
    | st.binary(max_size=12)
)
VALUES = NUMBERS | st.binary(max_size=300) | st.text(max_size=40).map(str.encode)
FIELD_NAMES = st.sampled_from([*NAMES, b"user_id", b"type", b"json", b"other"])
JSON_DOCS = st.dictionaries(
    st.sampled_from(["user_id", "type", "price", "brand", "product_id", "x"]),
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300)
    | st.lists(st.integers(), max_size=2),
    max_size=6,
).map(lambda d: json.dumps(d).encode())  # fmt: skip


def bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.int64)


def one_column(values: list[bytes]) -> RawInputs:
    """The values as one input's column, each empty one absent."""
    ends = np.cumsum([len(v) for v in values], dtype=np.int64).reshape(1, -1)
    starts = ends - np.array([len(v) for v in values], np.int64)
    return RawInputs(("price",), b"".join(values), starts, ends)


@settings(max_examples=150, deadline=None)
@given(st.lists(NUMBERS, max_size=40))
def test_numbers_parse_to_the_bits_numeric_values_gives(values):
    (got,) = stored_forms(one_column(values), [("price", True)], np.arange(len(values)))
    np.testing.assert_array_equal(bits(got), bits(numeric_values(values)))


@settings(max_examples=100, deadline=None)
@given(st.lists(VALUES, max_size=30))
def test_hashes_are_value_hashes(values):
    (got,) = stored_forms(one_column(values), [("price", False)], np.arange(len(values)))
    np.testing.assert_array_equal(got, value_hashes("price", values))


def test_plain_decimals_parse_without_python_and_others_with_it():
    values = [b"19.99", b"-0", b"007.50", b"123456789012345", b"1234567890123456", b"1e3",
              b"0.1", b"-12.5", b"inf", b"nan", b""]  # fmt: skip
    (got,) = stored_forms(one_column(values), [("price", True)], np.arange(len(values)))
    np.testing.assert_array_equal(bits(got), bits(numeric_values(values)))
    assert np.signbit(got[1]) and got[8] == np.inf and np.isinf(got[9]) and np.isnan(got[10])


def entries():
    """Entries of the kinds a stream holds: fields in a producer's order (names repeated,
    values over MAX_INPUT_BYTES, not UTF-8), events in a `json` field, an odd list."""
    pairs = st.lists(st.tuples(FIELD_NAMES, VALUES), max_size=6)
    flat = pairs.map(lambda ps: [x for kv in ps for x in kv])
    as_json = st.tuples(JSON_DOCS, st.booleans()).map(
        lambda d: [b"json", d[0], *([b"other", b"1"] if d[1] else [])]
    )
    return st.one_of(flat, flat, as_json, flat.map(lambda f: [*f, b"price"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(entries(), max_size=12), st.randoms())
def test_raw_inputs_give_the_stored_forms_of_input_columns(flats, rnd):
    rows = np.array(sorted(rnd.sample(range(len(flats)), rnd.randint(0, len(flats)))), np.int64)
    columns = list(zip(*[input_values(f, NAMES) for f in flats], strict=True)) or [()] * 3
    wanted = [("price", True), ("brand", False), ("product_id", False), ("price", False)]
    got = stored_forms(raw_inputs(flats, NAMES), wanted, rows)
    want = [numeric_values([columns[0][i] for i in rows])] + [
        value_hashes(name, [columns[NAMES.index(name.encode())][i] for i in rows])
        for name, _ in wanted[1:]
    ]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(bits(g), bits(w))


def test_a_value_over_the_limit_is_absent_and_the_last_of_a_repeated_name_counts():
    flats = [
        [b"user_id", b"u", b"type", b"v", b"brand", b"b" * (MAX_INPUT_BYTES + 1)],
        [b"user_id", b"u", b"type", b"v", b"brand", b"x", b"brand", b"y"],
        [b"json", b'{"user_id": "u", "type": "v", "brand": "y", "price": 2.5}'],
        [b"user_id", b"u", b"type", b"v", b"brand", b"b" * MAX_INPUT_BYTES],
    ]
    price, brand = stored_forms(raw_inputs(flats, NAMES), [("price", True), ("brand", False)],
                                np.arange(4))  # fmt: skip
    assert brand[0] == -1 and brand[1] == brand[2] == value_hashes("brand", [b"y"])[0]
    assert brand[3] >= 0 and np.isnan(price[:2]).all() and price[2] == 2.5


def test_values_holding_nul_bytes_are_read_whole():
    # the reader cuts a batch's joined values at NULs unless a value holds one
    clean = [b"user_id", b"u", b"type", b"v", b"brand", b"b1", b"price", b"2.5"]
    odd = [b"user_id", b"u", b"type", b"v", b"brand", b"b\x00\x001", b"price", b"\x002.5"]
    for flats in ([clean, clean, clean], [clean, odd, clean], [odd]):
        raw = raw_inputs(flats, NAMES)
        got = [[raw.data[a:b] for a, b in zip(s, e, strict=True)]
               for s, e in zip(raw.starts, raw.ends, strict=True)]  # fmt: skip
        columns = zip(*[input_values(f, NAMES) for f in flats], strict=True)
        want = [[v or b"" for v in col] for col in columns]
        assert got == want
