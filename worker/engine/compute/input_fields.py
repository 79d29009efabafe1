"""A batch's declared inputs read out of its entries' fields into one buffer
(model/input_bytes.py, RawInputs): the values `input_values` gives per entry
(worker/common/events.py, their definition), taken by C-level passes over the entries, not a
Python step per entry and input.
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import itemgetter

import numpy as np

from model.input_bytes import RawInputs
from worker.common.events import (
    MAX_INPUT_BYTES,
    input_picks,
    input_values,
    json_inputs,
    last_json,
)

_NAMES = itemgetter(slice(None, None, 2))


def raw_inputs(flats: list[list], names: tuple[bytes, ...]) -> RawInputs:
    """The values of the inputs `names` in each entry's fields (`flats`), grouped by their
    fields' order; a value absent or over MAX_INPUT_BYTES is empty."""
    raw = _Builder(len(names), len(flats))
    if np.any(np.fromiter(map(len, flats), np.int64, len(flats)) % 2):  # never from Redis
        per_entry = [input_values(flat, names) for flat in flats]
        for i in range(len(names)):
            raw.add(i, np.arange(len(flats)), [values[i] or b"" for values in per_entry])
        return raw.done(names)
    for rows, group in _by_order(flats):
        picks = input_picks(tuple(group[0][::2]), names)
        if picks is None:  # events in a `json` field, each parsed (few producers send them)
            docs = [json_inputs(last_json(flat), names) for flat in group]
            for i, name in enumerate(names):
                raw.add(i, rows, [doc[name] or b"" for doc in docs])
            continue
        for i, at in picks:
            raw.add(i, rows, list(map(itemgetter(at), group)))
    return raw.done(names)


def _by_order(flats: list[list]) -> Iterator[tuple[np.ndarray, list[list]]]:
    """(rows, their entries) of each order of field names in `flats`: one producer sends one
    order, so a batch has few, each found in C-level passes over the entries."""
    keys = list(map(tuple, map(_NAMES, flats)))
    distinct = {key: g for g, key in enumerate(dict.fromkeys(keys))}
    if len(distinct) < 2:
        if flats:
            yield np.arange(len(flats)), flats
        return
    codes = np.fromiter(map(distinct.__getitem__, keys), np.int64, len(keys))
    order = np.argsort(codes, kind="stable")
    bounds = np.bincount(codes).cumsum().tolist()
    for a, b in zip([0, *bounds[:-1]], bounds, strict=True):
        rows = order[a:b]
        yield rows, list(map(flats.__getitem__, rows.tolist()))


class _Builder:
    """RawInputs filled an input and a group of rows at a time."""

    def __init__(self, n_inputs: int, n: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.starts = np.zeros((n_inputs, n), np.int64)
        self.ends = np.zeros((n_inputs, n), np.int64)

    def add(self, i: int, rows: np.ndarray, values: list[bytes]) -> None:
        """Input i's values of `rows`, appended to the buffer (one over MAX_INPUT_BYTES
        stays there, empty: absent)."""
        if not values:
            return
        sizes = np.fromiter(map(len, values), np.int64, len(values))
        ends = self.size + np.cumsum(sizes)
        self.starts[i, rows] = np.where(sizes > MAX_INPUT_BYTES, ends, ends - sizes)
        self.ends[i, rows] = ends
        self.size = int(ends[-1])
        self.parts += values

    def done(self, names: tuple[bytes, ...]) -> RawInputs:
        """The inputs read."""
        data = b"".join(self.parts)
        return RawInputs(tuple(n.decode() for n in names), data, self.starts, self.ends)
