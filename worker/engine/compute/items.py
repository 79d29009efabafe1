"""A user's item memories in the state field `items`: for each item input a model declares,
the session's last items (model/inputs.py, ItemMemory), committed with the state so the
"same item as before" and "seen in this session" flags survive batches, restarts and
workers (docs/contract.md, User state and scores out).

Layout: for each item input, one byte of its name's length, the name (UTF-8), one byte of
the memory's length and the memory as model/inputs.py packs it (at most 65 bytes). Memories
are keyed by input name, not by model: an item's hash does not depend on the model's bucket
count, so a new model with the same item input reads them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from model.inputs import ItemMemory


def memories_of(names: Sequence[str], raw: list[bytes]) -> dict[str, ItemMemory]:
    """Each item input's memories of the users (one row per user), from their `items`
    fields; a field that is malformed, or lacks an input, reads as an empty memory."""
    if not names:
        return {}
    fields = [_split(r) for r in raw]
    return {name: ItemMemory.of([f.get(name, b"") for f in fields]) for name in names}


def _split(raw: bytes) -> dict[str, bytes]:
    """The packed memory of each input in one `items` field ({} when malformed)."""
    out: dict[str, bytes] = {}
    pos = 0
    try:
        while pos < len(raw):
            n = raw[pos]
            name = raw[pos + 1 : pos + 1 + n].decode("utf-8")
            pos += 1 + n
            m = raw[pos]
            out[name] = raw[pos + 1 : pos + 1 + m]
            pos += 1 + m
            if pos > len(raw):
                return {}
    except (IndexError, UnicodeDecodeError):
        return {}
    return out


def packed_items(memory: dict[str, ItemMemory], rows: np.ndarray) -> list[bytes]:
    """The `items` field of each of `rows`: every item input's memory, in name order."""
    names = sorted(memory)
    heads = [bytes([len(n.encode())]) + n.encode() for n in names]
    out = []
    for u in rows.tolist():
        parts = []
        for head, name in zip(heads, names, strict=True):
            mem = memory[name].pack(u)
            parts += [head, bytes([len(mem)]), mem]
        out.append(b"".join(parts))
    return out
