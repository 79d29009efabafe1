"""A user's item memories in the state field `items` (worker/engine/compute/items.py)."""

from __future__ import annotations

import numpy as np

from model.inputs import ItemMemory
from worker.engine.compute.items import memories_of, packed_items


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


def test_a_malformed_field_reads_as_empty_memories() -> None:
    for raw in (b"\x05abc", b"\x02ab\x09\x01", b"\xff" * 3, b"\x01\xff\x00"):
        mem = memories_of(["ab"], [raw])["ab"]
        assert mem.count.tolist() == [0]
