"""A user's item memories in the state field `items` (worker/engine/compute/items.py)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from model.item_memory import ITEM_MEMORY, ItemMemory, unpack_items
from worker.engine.compute.items import _packed_memories, memories_of, packed_items


def test_memories_round_trip_by_input_name() -> None:
    product, shop = ItemMemory.empty(2), ItemMemory.empty(2)
    product.keys[0, :3] = [11, 22, 33]
    product.count[0] = 3
    shop.keys[1, :1] = [7]
    shop.count[1] = 1
    packed = packed_items({"product_id": product, "shop": shop}, np.arange(2))
    back = memories_of(["product_id", "shop"], packed)
    assert back["product_id"].count.tolist() == [3, 0]
    assert back["product_id"].keys[0, :3].tolist() == [11, 22, 33]
    assert back["shop"].count.tolist() == [0, 1] and back["shop"].keys[1, 0] == 7
    # a model with only one of the inputs reads its own; an unknown input reads empty
    only = memories_of(["shop", "brand_new"], packed)
    assert only["shop"].count.tolist() == [0, 1] and only["brand_new"].count.tolist() == [0, 0]


def test_fields_over_255_bytes_read_back() -> None:
    # three inputs of long names, full memories: each field is ~400 bytes
    names = ["a" * 60, "b" * 60, "c" * 60]
    memory = {n: ItemMemory.empty(3) for n in names}
    for k, n in enumerate(names):
        memory[n].keys[:] = np.arange(ITEM_MEMORY) + 100 * k
        memory[n].count[:] = [ITEM_MEMORY, 1, 0]
    packed = packed_items(memory, np.arange(3))
    assert len(packed[0]) > 255
    back = memories_of(names, packed)
    for n in names:
        assert back[n].count.tolist() == [ITEM_MEMORY, 1, 0]
        np.testing.assert_array_equal(back[n].keys[0], memory[n].keys[0])


def test_a_malformed_field_reads_as_empty_memories() -> None:
    for raw in (b"\x05abc", b"\x02ab\x09\x01", b"\xff" * 3, b"\x01\xff\x00"):
        mem = memories_of(["ab"], [raw])["ab"]
        assert mem.count.tolist() == [0]


def _reference(name: str, raw: bytes) -> tuple[list[int], int]:
    """One field's memory of `name` by the layout's definition, read entry by entry."""
    entries, pos = {}, 0
    while pos < len(raw):
        n = raw[pos]
        if pos + 1 + n >= len(raw):
            return [], 0
        key, pos = raw[pos + 1 : pos + 1 + n], pos + 1 + n
        m = raw[pos]
        if pos + 1 + m > len(raw):
            return [], 0
        entries[key], pos = raw[pos + 1 : pos + 1 + m], pos + 1 + m
    keys, count = unpack_items(entries.get(name.encode()))
    return keys[:count].tolist(), count


def _fields():
    memory = st.lists(st.integers(0, 2**32 - 1), max_size=ITEM_MEMORY + 1).map(
        lambda ks: bytes([len(ks)]) + np.asarray(ks, "<u4").tobytes()
    )
    entry = st.tuples(st.sampled_from([b"ab", b"product_id", b"x"]), memory | st.binary(max_size=9))
    wellformed = st.lists(entry, max_size=3).map(
        lambda es: b"".join(bytes([len(k)]) + k + bytes([len(m)]) + m for k, m in es)
    )
    return st.lists(wellformed | st.binary(max_size=40), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(_fields())
def test_the_batched_reader_equals_the_layouts_definition(raw: list[bytes]) -> None:
    for name in ("ab", "product_id"):
        mem = memories_of([name], raw)[name]
        got = [(mem.keys[u, : mem.count[u]].tolist(), int(mem.count[u])) for u in range(len(raw))]
        assert got == [_reference(name, r) for r in raw]
        again = memories_of([name], packed_items({name: mem}, np.arange(len(raw))))[name]
        assert again.count.tolist() == mem.count.tolist()
        assert (again.keys == mem.keys).all()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.sampled_from(["product_id", "ab", "é" * 40, "x" * 64]), min_size=1, max_size=3,
             unique=True),
    st.integers(1, 6),
    st.randoms(),
)  # fmt: skip
def test_the_batched_packing_writes_each_inputs_part_as_its_definition(names, users, rnd) -> None:
    memory = {
        name: ItemMemory(
            np.array(
                [[rnd.randint(-(2**40), 2**40) for _ in range(ITEM_MEMORY)] for _ in range(users)],
                np.int64,
            ).reshape(users, ITEM_MEMORY),
            np.array([rnd.randint(-2, ITEM_MEMORY + 2) for _ in range(users)], np.int64),
        )
        for name in names
    }
    rows = np.array(sorted(rnd.sample(range(users), rnd.randint(0, users))), np.int64)
    parts = [_packed_memories(name, memory[name], rows) for name in sorted(names)]
    assert packed_items(memory, rows) == [b"".join(p) for p in zip(*parts, strict=True)]
