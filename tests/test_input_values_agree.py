"""A declared input's value means the same on every path: `score` and training read it from
a JSON line, the worker from a stream entry that a producer wrote (`publish()`'s fields) or
from its `json` object. For any JSON value, the hash and the parsed number agree."""

from __future__ import annotations

import json
import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model.input_encoding import numeric_values
from model.value_hash import value_hashes
from model.values import value_bytes
from worker.commands.event_files import recording_fields
from worker.common.events import MAX_INPUT_BYTES, EventError, event_from_mapping, input_values
from worker.producers.publisher import MAX_OTHER_FIELDS, entry_fields, other_fields

NAMES = ("price", "sku")

JSON_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([12.0, -0.0, 0.1 + 0.2, 1e-7, 1e22, 3.5])
    | st.text(max_size=12)
    | st.sampled_from(["", "12", "12.0", " 7", "n/a", "1e400", "-3"])
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)


def offline_values(doc: dict) -> list:
    """What `score` and training hand the model for the inputs of one JSON line."""
    out: deque = deque()
    list(recording_fields([json.dumps(doc)], out, NAMES))
    recorded = out.popleft()
    return [recorded.get(n) for n in NAMES]


def same_numbers(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal, NaN (absent) where the other is NaN, +inf (bad) where the other is +inf."""
    return all((math.isnan(x) and math.isnan(y)) or x == y for x, y in zip(a, b, strict=True))


@settings(max_examples=400, deadline=None)
@given(price=JSON_VALUES, sku=JSON_VALUES)
def test_every_path_reads_the_same_value(price, sku):
    doc = {"user_id": "u1", "type": "view", "price": price, "sku": sku}
    offline = offline_values(doc)
    # the worker, from the event sent as a `json` field
    in_json = input_values([b"json", json.dumps(doc).encode()], tuple(n.encode() for n in NAMES))
    # the worker, from the fields publish() writes
    fields = entry_fields(event_from_mapping(doc), other_fields(doc))
    flat = [x if isinstance(x, bytes) else str(x).encode() for kv in fields.items() for x in kv]
    in_fields = input_values(flat, tuple(n.encode() for n in NAMES))
    for k, name in enumerate(NAMES):
        ref = offline[k]
        if len(value_bytes(ref)) > MAX_INPUT_BYTES:
            continue  # over the entry's bound the worker reads absent; the offline paths keep it
        want_hash = value_hashes(name, [ref])
        want_number = numeric_values([ref])
        for got in (in_json[k], in_fields[k]):
            assert value_hashes(name, [got])[0] == want_hash[0], (name, ref, got)
            number = numeric_values([got])
            # a boolean is not a number: bad offline, bad (its text does not parse) in Redis
            assert same_numbers(number, want_number), (name, ref, got)


def test_publish_sends_other_scalar_fields_as_their_text():
    doc = {"user_id": "u1", "type": "view", "ts": 5, "event_id": "e1", "producer": "x:1",
           "json": "{}", "price": 12.0, "qty": 3, "ratio": 0.25, "member": True,
           "brand": "acme", "raw": b"\x01", "empty": "", "none": None, "tags": ["a"],
           "ctx": {"a": 1}, "long": "x" * 257}  # fmt: skip
    assert other_fields(doc) == {"price": b"12", "qty": b"3", "ratio": b"0.25",
                                 "member": b"True", "brand": b"acme", "raw": b"\x01"}  # fmt: skip
    assert other_fields({"huge": 10**5000, "big": 10**255}) == {"big": b"1" + b"0" * 255}
    with pytest.raises(EventError, match="not text"):
        other_fields({1: "a"})
    many = {f"f{i}": i for i in range(MAX_OTHER_FIELDS + 1)}
    with pytest.raises(EventError, match=f"at most {MAX_OTHER_FIELDS}"):
        other_fields(many)
    assert len(other_fields(dict(list(many.items())[:MAX_OTHER_FIELDS]))) == MAX_OTHER_FIELDS
