"""Declared inputs (model/inputs.py): the declaration, the stable hash (pinned), numeric
parsing, the item memory and a batch's extra block, each against a plain-Python reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from model.inputs import (
    CategoricalInput,
    Inputs,
    ItemInput,
    NumericInput,
    bucket_ids,
    fnv1a32,
    input_columns,
    input_width,
    numeric_column,
    parse_inputs,
    table_shapes,
    value_hash,
    value_hashes,
)

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
    spec = NumericInput.fit("price", "log1p", values)
    logs = np.log1p([10.0, 100.0, 1000.0])
    assert spec.mean == pytest.approx(logs.mean())
    assert spec.scale == pytest.approx(logs.std())
    value, missing, _ = numeric_column(spec, values)
    assert value[missing == 0].mean() == pytest.approx(0, abs=1e-6)
    assert NumericInput.fit("price", "none", [b"5", b"5"]).scale == 1.0
    assert NumericInput.fit("price", "none", [None]).model_dump()["mean"] == 0.0


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
        try:
            f = float(v) if v not in (None, b"", "") else None
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
