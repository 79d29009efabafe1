"""Declared inputs (model/inputs.py, model/input_encoding.py): the declaration, the stable
hash (pinned), numeric parsing, the item memory and a batch's extra block, each against a
plain-Python reference."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from model.input_encoding import (
    InputCounts,
    Stored,
    bucket_ids,
    encode_inputs,
    fitted_numeric,
    numeric_column,
    numeric_values,
    stored_values,
)
from model.inputs import (
    CategoricalInput,
    Inputs,
    ItemInput,
    NumericInput,
    input_columns,
    input_width,
    parse_inputs,
    table_name,
    table_shapes,
)
from model.item_memory import (
    ITEM_MEMORY,
    ITEM_MEMORY_BYTES,
    ItemMemory,
    item_flags,
    pack_items,
    unpack_items,
)
from model.value_hash import fnv1a32, value_hash, value_hashes

PRICE = {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 3.0, "scale": 1.5}
BRAND = {"kind": "categorical", "name": "brand", "buckets": 64, "dim": 3}
PRODUCT = {"kind": "item", "name": "product_id", "buckets": 1000, "dim": 4}


# ---- the declaration ---------------------------------------------------------------------


def test_declaration_widths_columns_and_tables():
    inputs = parse_inputs([PRICE, BRAND, PRODUCT])
    assert [type(s) for s in inputs] == [NumericInput, CategoricalInput, ItemInput]
    assert input_width(inputs) == 2 + 3 + 4 + 2
    assert input_columns(inputs) == [
        "price.value",
        "price.missing",
        "brand.embedding[0]",
        "brand.embedding[1]",
        "brand.embedding[2]",
        *[f"product_id.embedding[{j}]" for j in range(4)],
        "product_id.same_as_previous",
        "product_id.seen_in_session",
    ]
    assert table_shapes(inputs) == {
        "input.brand.embedding": (64, 3),
        "input.product_id.embedding": (1000, 4),
    }
    assert input_width(Inputs([])) == 0
    # as stored in meta.inputs: JSON and back
    assert parse_inputs(inputs.model_dump(mode="json")) == inputs


def test_declaration_is_frozen():
    spec = parse_inputs([BRAND])[0]
    with pytest.raises(ValidationError):
        spec.buckets = 3


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ([{**PRICE, "scale": 0}], "inputs.0.numeric.scale"),
        ([{**PRICE, "mean": math.nan}], "inputs.0.numeric.mean"),
        ([{**PRICE, "transform": "log"}], "inputs.0.numeric.transform"),
        ([{k: v for k, v in PRICE.items() if k != "mean"}], "inputs.0.numeric.mean"),
        ([{**BRAND, "buckets": 1}], "inputs.0.categorical.buckets"),
        ([{**BRAND, "buckets": 2**20 + 1}], "inputs.0.categorical.buckets"),
        ([{**BRAND, "dim": 0}], "inputs.0.categorical.dim"),
        ([PRICE, {**PRODUCT, "dim": 65}], "inputs.1.item.dim"),
        ([{**BRAND, "default": 1}], "inputs.0.categorical.default"),
        ([{**BRAND, "kind": "text"}], "inputs.0"),
        ([{**BRAND, "name": ""}], "inputs.0.categorical.name"),
        ([{**BRAND, "name": "type"}], "event fields"),
        ([{**BRAND, "name": "json"}], "event fields"),
        ([BRAND, {**PRODUCT, "name": "brand"}], "repeated: ['brand']"),
        ({"price": PRICE}, "inputs"),
    ],
)
def test_declaration_errors_are_one_line(doc, where):
    with pytest.raises(ValueError) as err:
        parse_inputs(doc)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("invalid inputs: ")
    assert where in message


def test_numeric_fit_standardises_the_training_values():
    values = [b"10", b"100", None, b"x", "1000"]
    spec = fitted_numeric("price", "log1p", values)
    logs = np.log1p([10.0, 100.0, 1000.0])
    assert spec.mean == pytest.approx(logs.mean())
    assert spec.scale == pytest.approx(logs.std())
    value, missing, _ = numeric_column(spec, values)
    assert value[missing == 0].mean() == pytest.approx(0, abs=1e-6)
    assert fitted_numeric("price", "none", [b"5", b"5"]).scale == 1.0
    assert fitted_numeric("price", "none", [None]).model_dump()["mean"] == 0.0


def test_a_few_absurd_values_do_not_set_the_numeric_scale():
    rng = np.random.default_rng(0)
    prices = rng.lognormal(3.0, 0.5, 2000)
    sane = fitted_numeric("price", "none", prices.tolist())
    spoilt = fitted_numeric("price", "none", [*prices.tolist(), 1e12, 1e15, 1e300])
    assert spoilt.scale == pytest.approx(sane.scale, rel=0.05)
    assert spoilt.mean == pytest.approx(sane.mean, rel=0.05)


# ---- the stable hash ---------------------------------------------------------------------


def test_fnv1a_is_the_published_fnv1a_32():
    # test vectors of the FNV reference (isthe.com/chongo/tech/comp/fnv)
    assert fnv1a32(b"") == 0x811C9DC5
    assert fnv1a32(b"a") == 0xE40C292C
    assert fnv1a32(b"foobar") == 0xBF9CF968


def test_hash_and_buckets_are_pinned():
    """A change of hash would silently break every trained model: these values are fixed."""
    assert value_hash("brand", "apple") == 19848249
    assert value_hash("brand", "samsung") == 1446042537
    assert value_hash("product_id", "12345") == 1304912372
    assert value_hash("brand", "été") == 2940464177
    assert list(value_hashes("brand", [b"apple", None, "samsung", "", "été"])) == [
        19848249,
        -1,
        1446042537,
        -1,
        2940464177,
    ]
    assert list(bucket_ids("brand", ["apple", "samsung", None, b""], 1000)) == [118, 28, 0, 0]
    assert (
        list(bucket_ids("product_id", [12345, "12345", 12345.0], 2**20))
        == [1 + 1304912372 % (2**20 - 1)] * 3
    )


def test_the_name_is_part_of_the_hash():
    assert value_hash("brand", "apple") != value_hash("category", "apple")
    assert value_hash("brand", "apple") == fnv1a32(b"brand\x1fapple")


values_st = st.lists(
    st.one_of(
        st.none(),
        st.text(max_size=12),  # unicode, empty
        st.binary(max_size=12),
        st.integers(-(10**12), 10**12),
    ),
    max_size=40,
)


def reference_bucket(name, value, buckets):
    if value is None or value in (b"", ""):
        return 0
    raw = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
    return 1 + fnv1a32(name.encode() + b"\x1f" + raw) % (buckets - 1)


@settings(max_examples=200, deadline=None)
@given(values=values_st, buckets=st.integers(2, 2**20), name=st.text(min_size=1, max_size=8))
def test_bucket_kernel_matches_the_python_reference(values, buckets, name):
    got = bucket_ids(name, values, buckets)
    assert got.dtype == np.int64 and got.shape == (len(values),)
    assert list(got) == [reference_bucket(name, v, buckets) for v in values]
    assert ((got >= 0) & (got < buckets)).all()


def test_bucket_ids_rejects_one_bucket():
    with pytest.raises(ValueError, match="at least 2"):
        bucket_ids("brand", ["a"], 1)


# ---- numeric parsing ---------------------------------------------------------------------


def test_numeric_column_hand_case():
    spec = NumericInput(name="price", transform="log1p", mean=1.0, scale=2.0)
    values = [b"1.5", None, b"", "abc", b"-2", 3, 2.5, math.nan, 10**400, True, b"1e400", " 7 "]
    value, missing, bad = numeric_column(spec, values)
    expect = {0: 1.5, 5: 3.0, 6: 2.5, 11: 7.0}
    for i in range(len(values)):
        if i in expect:
            assert value[i] == pytest.approx((math.log1p(expect[i]) - 1.0) / 2.0, rel=1e-6)
            assert missing[i] == 0
        else:
            assert value[i] == 0 and missing[i] == 1
    # absent: None and the two empties; bad: "abc", -2 (log1p), nan, 10**400, True, 1e400
    assert bad == 6
    assert value.dtype == missing.dtype == np.float32


def test_numeric_column_without_transform():
    spec = NumericInput(name="price", transform="none", mean=10.0, scale=5.0)
    value, missing, bad = numeric_column(spec, [b"20", b"-5", b"0"])
    assert list(value) == [2.0, -3.0, -2.0] and list(missing) == [0, 0, 0] and bad == 0
    value, missing, bad = numeric_column(spec, [])
    assert value.shape == missing.shape == (0,) and bad == 0


numeric_values_st = st.lists(
    st.one_of(
        st.none(),
        st.floats(allow_nan=True).map(lambda f: repr(f).encode()),
        st.integers(-(10**6), 10**6).map(lambda i: str(i).encode()),
        st.binary(max_size=6),
        st.text(max_size=6),
        st.floats(-1e6, 1e6),
    ),
    max_size=50,
)


@settings(max_examples=150, deadline=None)
@given(values=numeric_values_st)
def test_numeric_parsing_does_not_depend_on_the_batch(values):
    """Each value parses as it would alone (the halving fallback) and as float() does."""
    spec = NumericInput(name="price", transform="none", mean=0.0, scale=1.0)
    value, missing, bad = numeric_column(spec, values)
    n_bad = 0
    for i, v in enumerate(values):
        alone = numeric_column(spec, [v])
        assert (alone[0][0], alone[1][0]) == (value[i], missing[i])
        # a str parses as its UTF-8 bytes, as a stream holds it: float() on a str would
        # also take Unicode spaces and digits ("0\x85", "\u0661"), which bytes never carry
        raw = v.encode("utf-8", "surrogatepass") if isinstance(v, str) else v
        try:
            f = float(raw) if v not in (None, b"", "") else None
        except ValueError:
            f = math.nan
        with np.errstate(over="ignore"):
            finite = f is not None and bool(np.isfinite(np.float32(f)))  # the column's dtype
        if f is None:
            assert missing[i] == 1
        elif finite:
            assert missing[i] == 0 and value[i] == np.float32(f)
        else:
            n_bad += 1
            assert missing[i] == 1 and value[i] == 0
    assert bad == n_bad


# ---- the item memory ---------------------------------------------------------------------


def reference_flags(slot, keys, new_session, memory: dict[int, list[int]]):
    """item_flags in plain Python: memory[user] is the session's distinct items, oldest first."""
    flags = []
    for s, k, new in zip(slot, keys, new_session, strict=True):
        seen = memory.setdefault(int(s), [])
        if new:
            seen.clear()
        if k < 0:
            flags.append((0.0, 0.0))
            continue
        flags.append((float(bool(seen) and seen[-1] == k), float(k in seen)))
        if k in seen:
            seen.remove(k)
        seen.append(int(k))
        del seen[:-ITEM_MEMORY]
    return np.array(flags, np.float32).reshape(-1, 2)


def run_flags(slot, keys, new_session, mem: ItemMemory):
    return item_flags(
        np.asarray(slot, np.int64),
        np.asarray(keys, np.int64),
        np.asarray(new_session, np.bool_),
        mem.keys,
        mem.count,
    )


def test_item_flags_hand_case():
    # user 0: A A B (missing) B A, new session, A; user 1 interleaved: A then A
    A, B = 11, 22
    slot = [0, 0, 1, 0, 0, 0, 0, 1, 0]
    keys = [A, A, A, B, -1, B, A, A, A]
    new = [False, False, False, False, False, False, False, False, True]
    mem = ItemMemory.empty(2)
    flags = run_flags(slot, keys, new, mem)
    assert flags.tolist() == [
        [0, 0],  # A: first
        [1, 1],  # A again
        [0, 0],  # user 1's first A
        [0, 0],  # B
        [0, 0],  # no item: never the same, not remembered
        [1, 1],  # B: the previous item-bearing event had B
        [0, 1],  # A: seen earlier in the session
        [1, 1],  # user 1's A again
        [0, 0],  # A after a new session: forgotten
    ]
    assert mem.pack(0) == pack_items(np.array([A]), 1) == b"\x01" + A.to_bytes(4, "little")
    assert mem.count.tolist() == [1, 1]


def test_item_memory_keeps_the_last_16_distinct_items():
    # 1..20 keeps 5..20; then 4 (forgotten, drops 5), 20 (seen, not the previous), 20 (same)
    keys = [*range(1, 21), 4, 20, 20]
    mem = ItemMemory.empty(1)
    flags = run_flags([0] * len(keys), keys, [False] * len(keys), mem)
    assert flags[-3:].tolist() == [[0, 0], [0, 1], [1, 1]]
    assert mem.count[0] == ITEM_MEMORY
    packed = mem.pack(0)
    assert len(packed) == ITEM_MEMORY_BYTES == 65
    kept, n = unpack_items(packed)
    assert n == 16 and kept.tolist() == [*range(6, 20), 4, 20]


def test_unpack_items_reads_malformed_as_empty():
    good = pack_items(np.array([7, 2**32 - 1]), 2)
    assert unpack_items(good)[1] == 2 and unpack_items(good)[0][1] == 2**32 - 1
    empty = np.zeros(ITEM_MEMORY, np.int64)
    for raw in [None, b"", good[:-1], good + b"\x00", bytes([17]) + b"\x00" * 68, b"\x02" * 9]:
        keys, n = unpack_items(raw)
        assert n == 0 and (keys == empty).all(), raw
    assert pack_items(np.zeros(0, np.int64), 0) == b"\x00"
    assert ItemMemory.of([None, b"junk", good]).count.tolist() == [0, 0, 2]


events_st = st.lists(
    st.tuples(
        st.integers(0, 3),  # slot
        st.sampled_from([-1, *range(1, 24)]),  # item key: repeats, missing, more than K
        st.integers(0, 5).map(lambda i: i == 0),  # a new session now and then
    ),
    max_size=120,
)


@settings(max_examples=150, deadline=None)
@given(events=events_st, cuts=st.lists(st.integers(0, 120), max_size=5))
def test_item_flags_split_batches_equal_one_pass(events, cuts):
    """Batches split at random points, the memory packed and unpacked between them (as the
    user's state is committed), give the flags and memory of one pass and of the reference."""
    slot = [e[0] for e in events]
    keys = [e[1] for e in events]
    new = [e[2] for e in events]
    one = ItemMemory.empty(4)
    whole = run_flags(slot, keys, new, one)
    assert np.array_equal(whole, reference_flags(slot, keys, new, {}))

    packed: list[bytes | None] = [None] * 4
    parts = []
    bounds = [0, *sorted(c for c in cuts if c <= len(events)), len(events)]
    for a, b in itertools.pairwise(bounds):
        mem = ItemMemory.of(packed)
        parts.append(run_flags(slot[a:b], keys[a:b], new[a:b], mem))
        packed = [mem.pack(u) for u in range(4)]
    assert np.array_equal(np.concatenate(parts), whole)
    assert packed == [one.pack(u) for u in range(4)]
    assert all(len(p) <= ITEM_MEMORY_BYTES for p in packed)


# ---- a batch's extra block ---------------------------------------------------------------


def test_encode_inputs_hand_case():
    inputs = parse_inputs([PRICE, BRAND, PRODUCT])
    rng = np.random.default_rng(0)
    tables = {
        name: rng.normal(size=shape).astype(np.float32)
        for name, shape in table_shapes(inputs).items()
    }
    raw = {
        "price": [b"19.99", None, b"oops", "5"],
        "brand": [b"apple", b"apple", None, "samsung"],
        "product_id": [b"p1", b"p1", b"p2", None],
    }
    slot = np.array([0, 0, 1, 0], np.int64)
    new_session = np.zeros(4, np.bool_)
    memory = {"product_id": ItemMemory.empty(2)}
    x, counts = encode_inputs(inputs, tables, raw, slot, new_session, memory)

    assert x.shape == (4, input_width(inputs)) and x.dtype == np.float32
    assert counts == {
        "price": InputCounts(missing=1, bad=1),
        "brand": InputCounts(missing=1, bad=0),
        "product_id": InputCounts(missing=1, bad=0),
    }
    brand_t = tables[table_name(inputs[1])]
    item_t = tables[table_name(inputs[2])]
    for e in range(4):
        price = raw["price"][e]
        try:
            z = (math.log1p(float(price)) - 3.0) / 1.5
            expect = [z, 0.0]
        except (TypeError, ValueError):
            expect = [0.0, 1.0]
        expect += list(brand_t[reference_bucket("brand", raw["brand"][e], 64)])
        expect += list(item_t[reference_bucket("product_id", raw["product_id"][e], 1000)])
        expect += [[0, 0], [1, 1], [0, 0], [0, 0]][e]
        assert x[e] == pytest.approx(np.array(expect, np.float32), rel=1e-6), e
    assert np.array_equal(x[2, 2:5], brand_t[0])  # a missing value takes row 0
    assert memory["product_id"].count.tolist() == [1, 1]


def test_encode_inputs_without_inputs_is_an_empty_block():
    x, counts = encode_inputs(Inputs([]), {}, {}, np.zeros(3, np.int64), np.zeros(3, np.bool_), {})
    assert x.shape == (3, 0) and counts == {}


def test_encode_inputs_rejects_what_does_not_fit():
    inputs = parse_inputs([BRAND, PRODUCT])
    tables = {name: np.zeros(shape, np.float32) for name, shape in table_shapes(inputs).items()}
    raw = {"brand": [b"a"], "product_id": [b"p"]}
    args = (np.zeros(1, np.int64), np.zeros(1, np.bool_), {"product_id": ItemMemory.empty(1)})
    encode_inputs(inputs, tables, raw, *args)
    with pytest.raises(ValueError, match="'brand': 1 values expected, got none"):
        encode_inputs(inputs, tables, {"product_id": [b"p"]}, *args)
    with pytest.raises(ValueError, match="'brand': 1 values expected, got 2"):
        encode_inputs(inputs, tables, {**raw, "brand": [b"a", b"b"]}, *args)
    wrong = {**tables, "input.brand.embedding": np.zeros((63, 3), np.float32)}
    with pytest.raises(ValueError, match=r"must be \(64, 3\), got \(63, 3\)"):
        encode_inputs(inputs, wrong, raw, *args)
    with pytest.raises(ValueError, match="no item memory"):
        encode_inputs(inputs, tables, raw, *args[:2], {})


# ---- stored forms ------------------------------------------------------------------------

ODD_PRICES = [b"19.99", None, b"", b"oops", "nan", b"inf", b"-2", 3, 0.25, True, b"1e400", b"7"]


@pytest.mark.parametrize("buckets", [(64, 1000), (7, 13)])
def test_stored_columns_give_the_raw_values_x_and_counts(buckets):
    """A history keeps numbers parsed and values hashed: any model, whatever its bucket
    counts, gets from them the block, item flags and counts the raw values give."""
    inputs = parse_inputs([PRICE, BRAND | {"buckets": buckets[0]},
                           PRODUCT | {"buckets": buckets[1]}])  # fmt: skip
    rng = np.random.default_rng(4)
    n = 60
    raw = {
        "price": [ODD_PRICES[i] for i in rng.integers(len(ODD_PRICES), size=n)],
        "brand": [[b"apple", "samsung", None, b"", 42][i] for i in rng.integers(5, size=n)],
        "product_id": [[b"p1", b"p2", "p3", None, 17][i] for i in rng.integers(5, size=n)],
    }
    tables = {k: rng.normal(size=s).astype(np.float32) for k, s in table_shapes(inputs).items()}
    slot = rng.integers(3, size=n).astype(np.int64)
    new_session = rng.random(n) < 0.1

    def block(columns):
        memory = {"product_id": ItemMemory.empty(3)}
        x, counts = encode_inputs(inputs, tables, columns, slot, new_session, memory, 10)
        return x, counts, memory["product_id"].keys.copy()

    stored = {s.name: Stored(stored_values(s, raw[s.name])) for s in inputs}
    want, got = block(raw), block(stored)
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1] == want[1] and want[1]["price"].bad > 0
    np.testing.assert_array_equal(got[2], want[2])


def test_numeric_values_mark_absent_as_nan_and_unusable_as_infinite():
    v = numeric_values([b"2.5", None, b"", b"oops", "nan", b"-2"])
    assert v[0] == 2.5 and np.isnan(v[1:3]).all() and (v[3:5] == np.inf).all() and v[5] == -2


def test_counts_start_at_count_from():
    inputs = parse_inputs([PRICE])
    raw = {"price": [None, b"oops", b"3", None, b"oops"]}
    _, counts = encode_inputs(inputs, {}, raw, np.zeros(5, np.int64), np.zeros(5, np.bool_), {}, 2)
    assert counts == {"price": InputCounts(missing=1, bad=1)}
