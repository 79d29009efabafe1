"""A batch's declared inputs read out of its entries' fields into one buffer
(model/input_bytes.py, RawInputs): the values `input_values` gives per entry
(worker/common/events.py, their definition), taken by C-level passes over the entries, not a
Python step per entry and input.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import chain
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
from worker.engine.compute.columnar import nul_spans

_NAMES = itemgetter(slice(None, None, 2))
_SEP = b"\0"


def raw_inputs(flats: list[list], names: tuple[bytes, ...], one_order: bool = False) -> RawInputs:
    """The values of the inputs `names` in each entry's fields (`flats`), grouped by their
    fields' order (`one_order`: the caller knows all have the first one's); a value absent or
    over MAX_INPUT_BYTES is empty."""
    try:
        return (one_order and _by_column(flats, names)) or _grouped(flats, names, one_order)
    except IndexError:  # a field name without its value (never from Redis): entry by entry
        raw = _Builder(len(names), len(flats))
        per_entry = [[v or b"" for v in input_values(flat, names)] for flat in flats]
        raw.add(list(range(len(names))), slice(None), per_entry)
        return raw.done(names)


def _by_column(flats: list[list], names: tuple[bytes, ...]) -> RawInputs | None:
    """raw_inputs of entries that all have the first one's field names in its order: each
    input's values joined by NUL a column at a time (one C-level pass per input) and cut at
    the NULs; None when a value holds a NUL or the events are in `json` fields."""
    picks = input_picks(tuple(flats[0][::2]), names) if flats else None
    if not picks:
        return None
    n = len(flats)
    data = _SEP.join([_SEP.join([f[at] for f in flats]) for _, at in picks])
    spans = nul_spans(data, len(picks) * n)
    if spans is None:
        return None
    first, last = (x.reshape(len(picks), n) for x in spans)
    too_long = last - first > MAX_INPUT_BYTES
    first[too_long] = last[too_long]
    starts, ends = np.zeros((len(names), n), np.int64), np.zeros((len(names), n), np.int64)
    inputs = [i for i, _ in picks]
    starts[inputs], ends[inputs] = first, last
    return RawInputs(tuple(x.decode() for x in names), data, starts, ends)


def _grouped(flats: list[list], names: tuple[bytes, ...], one_order: bool) -> RawInputs:
    """raw_inputs a group of entries of one field order at a time; IndexError when an
    entry's last field has no value and its name is one that counts."""
    raw = _Builder(len(names), len(flats))
    for rows, group in [(slice(None), flats)] if one_order and flats else _by_order(flats):
        picks = input_picks(tuple(group[0][::2]), names)
        if picks is None:  # events in a `json` field, each parsed (few producers send them)
            docs = [json_inputs(last_json(flat), names).values() for flat in group]
            raw.add(list(range(len(names))), rows, [[v or b"" for v in doc] for doc in docs])
        elif picks:
            take = itemgetter(*(at for _, at in picks))
            values = map(take, group) if len(picks) > 1 else ([v] for v in map(take, group))
            raw.add([i for i, _ in picks], rows, values)
    return raw.done(names)


def _by_order(flats: list[list]) -> Iterator[tuple[slice | np.ndarray, list[list]]]:
    """(rows, their entries) of each order of field names in `flats`: one producer sends one
    order, so a batch has few (most often one, found by comparing lists, without hashing)."""
    if not flats:
        return
    orders = list(map(_NAMES, flats))
    if orders.count(orders[0]) == len(orders):
        yield slice(None), flats
        return
    keys = list(map(tuple, orders))
    distinct = {key: g for g, key in enumerate(dict.fromkeys(keys))}
    codes = np.fromiter(map(distinct.__getitem__, keys), np.int64, len(keys))
    order = np.argsort(codes, kind="stable")
    bounds = np.bincount(codes).cumsum().tolist()
    for a, b in zip([0, *bounds[:-1]], bounds, strict=True):
        rows = order[a:b]
        yield rows, list(map(flats.__getitem__, rows.tolist()))


class _Builder:
    """RawInputs filled a group of rows at a time."""

    def __init__(self, n_inputs: int, n: int) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.starts = np.zeros((n_inputs, n), np.int64)
        self.ends = np.zeros((n_inputs, n), np.int64)

    def add(self, inputs: list[int], rows: slice | np.ndarray, values: Iterable) -> None:
        """The values of `inputs` (one sequence per row of `rows`, in their order) appended
        to the buffer; one over MAX_INPUT_BYTES stays there, empty: absent."""
        parts = list(chain.from_iterable(values))
        if not parts:
            return
        chunk, starts, ends = _spans(parts)
        starts += self.size
        ends += self.size
        self.size += len(chunk)
        self.chunks.append(chunk)
        too_long = ends - starts > MAX_INPUT_BYTES
        starts[too_long] = ends[too_long]
        at = (inputs, rows) if isinstance(rows, slice) else np.ix_(inputs, rows)
        self.starts[at] = starts.reshape(-1, len(inputs)).T
        self.ends[at] = ends.reshape(-1, len(inputs)).T

    def done(self, names: tuple[bytes, ...]) -> RawInputs:
        """The inputs read."""
        data = b"".join(self.chunks)
        return RawInputs(tuple(n.decode() for n in names), data, self.starts, self.ends)


def _spans(parts: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The parts in one buffer, and where each starts and ends in it. Joined by NUL and cut at
    the NULs (two C-level passes, no Python per part), unless a part holds a NUL (never a
    shop's field; the NULs' count tells): then measured one by one."""
    chunk = _SEP.join(parts)
    spans = nul_spans(chunk, len(parts))
    if spans is not None:
        return chunk, *spans
    ends = np.cumsum(np.fromiter(map(len, parts), np.int64, len(parts)))
    return b"".join(parts), np.concatenate(([0], ends[:-1])), ends
