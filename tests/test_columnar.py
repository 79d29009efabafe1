"""A batch parsed column by column (worker/engine/compute/columnar.py) is the batch the
entry-at-a-time parse gives, whatever the entries hold; and a clean batch of one layout takes
the columns."""

from __future__ import annotations

import zlib
from dataclasses import asdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.common.events import MAX_TS_MS, MIN_TS_MS
from worker.engine.compute import batch as batch_module
from worker.engine.compute import columnar
from worker.engine.compute.batch import parse_batch, seconds_of

NOW = 1_700_000_000_000
LAYOUTS = [
    (b"user_id", b"type"),
    (b"user_id", b"type", b"ts"),
    (b"user_id", b"type", b"ts", b"event_id"),
    (b"user_id", b"type", b"event_id", b"producer"),
    (b"user_id", b"type", b"ts", b"event_id", b"producer"),
    (b"user_id", b"type", b"ts", b"event_id", b"price", b"brand"),
    (b"user_id", b"type", b"price", b"ts"),  # ts after another field: entry by entry
    (b"type", b"user_id"),
    (b"user_id", b"type", b"json"),
]
INPUTS = ("price", "brand", "ts")
GOOD = {
    # all of partition 2 of 3 but u2 (0) and user-42 (1): most batches of 3 partitions are
    # read from their partition, so that the columns can take them
    b"user_id": st.sampled_from(
        [b"u1", "é".encode(), b"x" * 256, b"u3", b"u4", b"u5", b"u8", b"u2", b"user-42"]
    ),
    b"type": st.sampled_from([b"view", b"purchase", b"add_to_cart"]),
    b"ts": st.integers(NOW - 10**6, NOW + 10**5).map(lambda t: str(t).encode()),
    b"event_id": st.sampled_from([b"e1", b"bench-9", b"~!", b"a" * 128]),
    b"producer": st.sampled_from(
        [b"p1:1", b"abc:99", b"q:0", b"p" * 64 + b":007", b"~!:123456789012345678"]
    ),
    b"price": st.sampled_from([b"9.99", b"", b"12"]),
    b"brand": st.sampled_from([b"acme", b"\xff", b"b\x00"]),
    b"json": st.sampled_from([b"{}", b'{"user_id": "z", "type": "v"}']),
}
BAD = st.sampled_from([
    b"", b"\x00", b"a\x00b", b"\xff\xfe", b"x" * 257, b"sp ace", b"a" * 129, b"-1", b"1e3",
    b"0001700000000000", b"123456789012345", str(MAX_TS_MS + 1).encode(), b"999999999999",
    str(MIN_TS_MS - 1).encode(), str(NOW + 10**7).encode(), b"p:", b"p1:x", b"0",
    b"p" * 65 + b":1", b":1", b"p:1234567890123456789", b"p:q:1", b"p :1", b"p:-1",
])  # fmt: skip
IDS = st.one_of(
    st.integers(NOW - 10**5, NOW + 10**5).map(lambda t: f"{t}-0".encode()),
    st.integers(NOW - 10**5, NOW + 10**5).map(lambda t: f"{t}-7".encode()),
    st.integers(NOW, NOW + 5).map(lambda t: str(t).encode()),
)
# ids Redis would not send, but the entry-at-a-time parse reads
ODD_IDS = st.sampled_from([b"0-1", f"{MAX_TS_MS + 5}-0".encode(), b"12-", b"0001700000000000-5",
                     b"1234567890123456789-0", b"1-12345678901234567890"])  # fmt: skip


@st.composite
def batches(draw):
    """Entries of one layout, each value valid but for a few; sometimes an entry of another
    layout, a nil entry or an odd field list."""
    layout = draw(st.sampled_from(LAYOUTS))
    odd = 0 if draw(st.booleans()) else 14  # half the batches all valid, if their layout is
    entries = []
    for _ in range(draw(st.integers(1, 12))):
        flat = []
        for name in layout:
            flat += [name, draw(BAD if odd and draw(st.integers(0, odd)) == 0 else GOOD[name])]
        kind = draw(st.integers(0, 30)) if odd else 3
        if kind == 0:
            flat = flat[:-1]
        elif kind == 1:
            flat = flat[2:] + flat[:2]
        elif kind == 2:
            flat = None
        odd_id = odd and draw(st.integers(0, odd)) == 0
        entries.append([draw(ODD_IDS if odd_id else IDS), flat])
    return entries


def by_columns(*args, **kwargs):
    """parse_batch with the columns tried at any size (by default a batch below
    COLUMNS_FROM entries goes one by one)."""
    with pytest.MonkeyPatch.context() as m:
        m.setattr(batch_module, "COLUMNS_FROM", 0)
        return parse_batch(*args, **kwargs)


def entry_by_entry(*args, **kwargs):
    with pytest.MonkeyPatch.context() as m:
        m.setattr(batch_module, "_parsed_by_columns", lambda *a: None)
        return parse_batch(*args, **kwargs)


def as_dict(b) -> dict:
    out = asdict(b)
    out.pop("parse_seconds")
    # one by one, the seconds are left to the resends stage (seconds_of): the columns' agree
    seconds = b.entry_seconds if b.entry_seconds is not None else seconds_of(b.entry_keys)
    out["entry_seconds"] = seconds.tolist()
    raw = out.pop("inputs")
    if raw is not None:
        out["inputs"] = [
            [raw["data"][a:z] for a, z in zip(s, e, strict=True)]
            for s, e in zip(raw["starts"], raw["ends"], strict=True)
        ]
    return out


@settings(max_examples=300, deadline=None)
@given(batches(), st.sampled_from([(0, 1), (2, 3), (2, 3), (0, 3)]), st.booleans())
def test_the_columns_give_the_entry_by_entry_batch(entries, where, inputs):
    partition, partitions = where
    names = INPUTS if inputs else ()
    got = by_columns(partition, entries, partitions, 600_000, names)
    want = entry_by_entry(partition, entries, partitions, 600_000, names)
    assert as_dict(got) == as_dict(want)


def publish_layout(n: int, users: list[str]) -> list:
    return [
        [f"{NOW + i}-{i % 3}".encode(),
         [b"user_id", users[i % len(users)].encode(), b"type", b"view", b"ts",
          str(NOW + i - 50).encode(), b"event_id", f"e{i}".encode(), b"producer",
          f"p:{i}".encode(), b"price", b"3.5"]]
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize("partitions", [1, 4])
def test_a_clean_batch_of_one_layout_is_parsed_by_columns(partitions):
    users = [u for u in (f"user-{k}" for k in range(200)) if zlib.crc32(u.encode()) % 4 == 1]
    entries = publish_layout(300, users)
    flats = [flat for _, flat in entries]
    ids = [i for i, _ in entries]
    cols = columnar.parsed_columns(ids, flats, 1 if partitions > 1 else 0, partitions, 600_000)
    assert cols is not None
    assert cols.users[:2] == users[:2] and cols.types == ["view"] * 300
    assert cols.ts[5] == NOW + 5 - 50 and cols.entry_keys[5] == (NOW + 5, 2)
    assert cols.event_ids[7] == b"e7" and cols.producers[7] == (b"p", 7)


def test_user_partitions_are_zlibs_crc32():
    users = [b"a", b"", "é".encode(), b"user-123456", bytes(range(1, 256))]
    buf = b"\0".join(users)
    ends = np.cumsum([len(u) + 1 for u in users]) - 1
    starts = ends - [len(u) for u in users]
    got = columnar._partitions(np.frombuffer(buf, np.uint8), starts, ends, 1 << 40)
    assert got.tolist() == [zlib.crc32(u) for u in users]
