"""A batch's values of the declared inputs (model/inputs.py) as x's extra block: numbers
parsed, standardised and flagged, categorical and item values hashed into buckets and their
embedding rows gathered, the item flags and the session statistics; and the values' stored
form. Pure computation (numpy, Numba): scoring and training call it alike.

Stored forms
------------
A value as a history keeps it (worker/engine/compute/recent.py), the same for every model
declaring the input: a numeric value parsed but not transformed (`numeric_values`: float64,
NaN when absent, +inf when present but not a number), a categorical or item value as its
32-bit hash (`value_hashes`: int64, -1 when absent). A model's bucket is 1 + hash mod
(buckets - 1), a function of the hash alone, and the item memory keeps hashes, so a column
in stored form (`Stored`) gives every model the x_t the raw values give it, and the same
missing and bad counts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

import numpy as np

from model.inputs import (
    MISSING_BUCKET,
    STATS_FLOATS,
    Inputs,
    InputSpec,
    NumericInput,
    input_width,
    session_inputs,
    spec_width,
    specs_of,
    table_columns,
    table_name,
)

# The kernels (item_flags, value_hashes, write_session_stats) are imported where they run: a
# model is loaded, checked and listed without Numba (`intentstream model list` starts in half
# the time).
if TYPE_CHECKING:
    from model.item_memory import ItemMemory


def fitted_numeric(
    name: str, transform: Literal["log1p", "none"], values: Sequence, session: bool = False
) -> NumericInput:
    """The declaration standardising `values` (a training set's): the mean and standard
    deviation of its usable transformed values, from 200 of them on clipped to their
    0.5-99.5 percentiles first, so that a few absurd prices do not set the scale (scale 1
    when they do not vary)."""
    probe = NumericInput(name=name, transform=transform, mean=0.0, scale=1.0)
    v, missing, _ = numeric_column(probe, values)
    used = v[missing == 0].astype(np.float64)
    if used.size >= 200:
        used = np.clip(used, *np.percentile(used, [0.5, 99.5]))
    mean = float(used.mean()) if used.size else 0.0
    std = float(used.std()) if used.size else 0.0
    scale = std if std > 1e-12 else 1.0
    return NumericInput(name=name, transform=transform, mean=mean, scale=scale, session=session)


# ---- the stable hash ---------------------------------------------------------------------


def buckets_of(hashes: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket of each hash: 1 + hash mod (buckets - 1); MISSING_BUCKET (0) where hash < 0."""
    return np.where(hashes < 0, MISSING_BUCKET, 1 + hashes % (buckets - 1)).astype(np.int64)


def bucket_ids(
    name: str, values: Sequence[bytes | str | int | float | None], buckets: int
) -> np.ndarray:
    """Each value's bucket (int64): 0 for missing (None or empty), else 1..buckets-1."""
    from model.value_hash import value_hashes

    if buckets < 2:
        raise ValueError(f"buckets must be at least 2, got {buckets}")
    return buckets_of(value_hashes(name, values), buckets)


@dataclass(frozen=True)
class Stored:
    """An input's values in their stored form (module docstring, Stored forms): float64
    numbers of a numeric input, int64 hashes of a categorical or item one."""

    values: np.ndarray

    def __len__(self) -> int:
        return self.values.shape[0]


def stored_values(spec: InputSpec, values: Sequence) -> np.ndarray:
    """Raw values of one input in their stored form: `numeric_values` or `value_hashes`."""
    from model.value_hash import value_hashes

    if spec.kind == "numeric":
        return numeric_values(values)
    return value_hashes(spec.name, values)


# ---- numeric parsing ---------------------------------------------------------------------


def _numeric_bytes(v: object) -> bytes | None:
    """A numeric value as bytes for numpy's parser; None when missing (None or empty)."""
    if v is None or v == b"" or v == "":
        return None
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode("utf-8", "surrogatepass")
    if isinstance(v, bool):  # JSON true/false is not a number
        return b"?"
    if isinstance(v, float):
        return repr(v).encode()
    if isinstance(v, int):
        return str(v).encode() if abs(v) < 10**300 else b"inf"  # numpy reads long digits
    return b"?"  # a list, an object: unparsable


def _parse(vals: list[bytes]) -> np.ndarray:
    """float64 of each value, NaN where it does not parse. The whole list goes through numpy
    at once; a list with a failure is halved until the failures are alone (per item only for
    them and their few neighbours), so a value parses the same in every batch."""
    if not vals:
        return np.zeros(0, np.float64)
    try:
        return np.array(vals, dtype=np.bytes_).astype(np.float64)
    except (ValueError, TypeError, OverflowError):
        if len(vals) == 1:
            return np.array([np.nan])
    half = len(vals) // 2
    return np.concatenate([_parse(vals[:half]), _parse(vals[half:])])


def numeric_values(values: Sequence[bytes | str | int | float | None]) -> np.ndarray:
    """Each value parsed as a float64 before any transform: NaN where absent (None or empty),
    +inf where present but not a number (unparsable, or NaN), as `numeric_column` counts it bad."""
    n = len(values)
    raw = [v if type(v) is bytes and v else _numeric_bytes(v) for v in values]
    present = np.fromiter((r is not None for r in raw), np.bool_, n)
    v = np.full(n, np.nan)
    parsed = _parse([r for r in raw if r is not None])
    v[present] = np.where(np.isnan(parsed), np.inf, parsed)
    return v


def numeric_column(
    spec: NumericInput, values: Sequence[bytes | str | int | float | None] | Stored
) -> tuple[np.ndarray, np.ndarray, int]:
    """A numeric input's two columns for a batch, and how many values were bad.

    Returns (value (N,) float32: the standardised value, 0 where missing or bad;
    missing (N,) float32: 1 where missing or bad; bad: how many were present but did not parse
    or were not finite after the transform). Never raises on a value.
    """
    value, missing, bad = _numeric_parts(spec, _numbers(values))
    return value, missing, int(np.count_nonzero(bad))


def _numbers(values: Sequence | Stored) -> np.ndarray:
    """A numeric column's values in stored form (given so, or parsed now)."""
    return values.values if isinstance(values, Stored) else numeric_values(values)


def transformed(spec: NumericInput, v: np.ndarray) -> np.ndarray:
    """Numbers in stored form through the input's transform (float64; NaN stays NaN)."""
    if spec.transform != "log1p":
        return v
    with np.errstate(all="ignore"):
        return np.log1p(v)


def _numeric_parts(spec: NumericInput, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, missing flag, bad mask) of numbers in stored form (numeric_column)."""
    present = ~np.isnan(v)
    with np.errstate(all="ignore"):
        z = ((transformed(spec, v) - spec.mean) / spec.scale).astype(np.float32)
    ok = np.isfinite(z)
    return np.where(ok, z, np.float32(0)), (~ok).astype(np.float32), present & ~ok


# ---- a batch's extra block ---------------------------------------------------------------


class InputCounts(NamedTuple):
    """Per input and batch: values absent (None or empty) and values present but unusable."""

    missing: int
    bad: int


def input_parts(
    inputs: Inputs | Sequence[InputSpec],
    raw: Mapping[str, Sequence],
    slot: np.ndarray,
    new_session: np.ndarray,
    memory: Mapping[str, ItemMemory],
    count_from: int = 0,
    stats: Mapping[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, InputCounts]]:
    """x's extra block without the embedding rows, for a batch: (fixed (N, input_width)
    float32, the numeric and flag columns, 0 in every embedding column; buckets (N, K) int64,
    the bucket of each event's value of each categorical and item input, in declaration
    order; each input's counts of the events from `count_from` on). encode_inputs gathers the
    rows into the block; training keeps the buckets, to look the rows up from the parameters
    it is fitting. Arguments as encode_inputs's (memory and stats updated in place)."""
    from model.item_memory import item_flags
    from model.session_stats import write_session_stats

    specs = specs_of(inputs)
    n = slot.shape[0]
    fixed = np.zeros((n, input_width(specs)), np.float32)
    tables = [s for s in specs if s.kind != "numeric"]
    buckets = np.zeros((n, len(tables)), np.int64)
    counts: dict[str, InputCounts] = {}
    col, k = 0, 0
    for spec in specs:
        values = _checked(spec, raw, n)
        if spec.kind == "numeric":
            value, missing, bad_mask = _numeric_parts(spec, _numbers(values))
            fixed[:, col] = value
            fixed[:, col + 1] = missing
            bad = int(np.count_nonzero(bad_mask[count_from:]))
            counts[spec.name] = InputCounts(int(missing[count_from:].sum()) - bad, bad)
            if spec.session:
                write_session_stats(fixed, col, slot, new_session, session_stats_of(spec, stats))
            col += spec_width(spec)
            continue
        hashes = _hashes(spec.name, values)
        buckets[:, k] = buckets_of(hashes, spec.buckets)
        counts[spec.name] = InputCounts(int(np.count_nonzero(hashes[count_from:] < 0)), 0)
        col += spec.dim
        k += 1
        if spec.kind == "item":
            mem = memory.get(spec.name)
            if mem is None:
                raise ValueError(f"input {spec.name!r}: no item memory given")
            fixed[:, col : col + 2] = item_flags(slot, hashes, new_session, mem.keys, mem.count)
            col += 2
    return fixed, buckets, counts


def empty_session_stats(
    inputs: Inputs | Sequence[InputSpec], n_users: int
) -> dict[str, np.ndarray]:
    """Statistics of n_users users with no value yet, for each numeric input with `session`."""
    return {name: np.zeros((n_users, STATS_FLOATS), np.float32) for name in session_inputs(inputs)}


def session_stats_of(spec: NumericInput, stats: Mapping[str, np.ndarray] | None) -> np.ndarray:
    """The users' session statistics of a numeric input with `session` (ValueError if none)."""
    got = (stats or {}).get(spec.name)
    if got is None:
        raise ValueError(f"input {spec.name!r}: no session statistics given")
    return got


def _checked(spec: InputSpec, raw: Mapping[str, Sequence], n: int) -> Sequence | Stored:
    """The input's n values in `raw` (ValueError when absent or of another length)."""
    values = raw.get(spec.name)
    if values is None or len(values) != n:
        got = "none" if values is None else len(values)
        raise ValueError(f"input {spec.name!r}: {n} values expected, got {got}")
    return values


def stored_column(spec: InputSpec, raw: Mapping[str, Sequence], n: int) -> np.ndarray:
    """The input's n values in `raw` in their stored form (float64 numbers, int64 hashes),
    given so or converted now; ValueError when absent or of another length."""
    values = _checked(spec, raw, n)
    return _numbers(values) if spec.kind == "numeric" else _hashes(spec.name, values)


def _hashes(name: str, values: Sequence | Stored) -> np.ndarray:
    """A categorical or item column's value hashes (given stored, or hashed now)."""
    from model.value_hash import value_hashes

    if isinstance(values, Stored):
        return np.ascontiguousarray(values.values, np.int64)
    return value_hashes(name, values)


def encode_inputs(
    inputs: Inputs | Sequence[InputSpec],
    tables: Mapping[str, np.ndarray],
    raw: Mapping[str, Sequence],
    slot: np.ndarray,
    new_session: np.ndarray,
    memory: Mapping[str, ItemMemory],
    count_from: int = 0,
    stats: Mapping[str, np.ndarray] | None = None,
) -> tuple[np.ndarray, dict[str, InputCounts]]:
    """x's extra block (N, input_width) float32 for a batch, and each input's counts of the
    events from `count_from` on (the ones before are replays, counted when first scored).

    raw[name] holds the N events' values of each input (None = absent), or a `Stored`
    column of them (the same x as their raw values); tables holds each
    categorical and item input's embedding table (`table_name`, (buckets, dim)); slot and
    new_session are the batch's user slots and session starts (as item_flags reads them), and
    memory[name] the item memory of each item input and stats[name] the session statistics
    (model/session_stats.py) of each numeric input with `session`, both updated in place.
    Embedding rows are
    gathered with fancy indexing; per-event Python only where value_hashes and numeric_column
    say.
    """
    specs = specs_of(inputs)
    with_table = [s for s in specs if s.kind != "numeric"]
    for spec in with_table:
        table = tables.get(table_name(spec))
        if table is None or table.shape != (spec.buckets, spec.dim):
            got = "none" if table is None else table.shape
            raise ValueError(
                f"input {spec.name!r}: table {table_name(spec)} must be "
                f"({spec.buckets}, {spec.dim}), got {got}"
            )
    out, buckets, counts = input_parts(specs, raw, slot, new_session, memory, count_from, stats)
    for k, (spec, (col, dim)) in enumerate(zip(with_table, table_columns(specs), strict=True)):
        out[:, col : col + dim] = tables[table_name(spec)][buckets[:, k]]
    return out, counts
