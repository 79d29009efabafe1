"""Applying a model to batches of events: the one path both `intentstream score` and the
worker use, so offline and online scores are the same math.

Data flows one way: events (slot, type, ts, and a format 2 model's declared inputs) ->
features, session resets and the inputs' block -> the batched cell kernel -> new states (and
item memories) and one score per event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numba as nb
import numpy as np

from model.artifact import Model, memory_floats, state_shape
from model.calibration import calibration_of, with_ends
from model.cells.ops import (
    HEAD_IDENTITY,
    HEAD_SIGMOID,
    CellWeights,
    cell_weights,
    wide_head,
    work_size,
)
from model.cells.step import step_batch
from model.features import (
    advance_memory,
    event_gaps,
    feature_matrix,
    session_resets,
)
from model.input_encoding import (
    InputCounts,
    Stored,
    encode_inputs,
    session_stats_of,
    stored_column,
    transformed,
)
from model.inputs import (
    STATS_FLOATS,
    InputSpec,
    session_inputs,
    spec_width,
    table_columns,
    table_name,
)
from model.item_memory import ItemMemory, write_item_flags
from model.params import Params, pack
from model.session_stats import write_session_stats

# A table input's embedding rows reach layer 0 only through W_fh, so each table can be passed
# through it once, at load: P = table @ W_fh[its rows], (buckets, G·H). A batch then adds one
# projected row per event and table to its type's row (the identity type_in already uses for
# event types) instead of dim x G·H products per event in the kernel. Done while every P stays
# under this size; larger tables keep the embedding columns.
PROJECTED_MAX_BYTES = 8 << 20


class Projection(NamedTuple):
    """A model's table inputs passed through W_fh (see PROJECTED_MAX_BYTES)."""

    # the table inputs' projected tables stacked, in declaration order: (sum of buckets, G·H)
    # float32, input k's bucket b at row offsets[k] + b
    tables: np.ndarray
    offsets: np.ndarray  # (K,) int64
    kept: np.ndarray  # the input block's columns still fed as features (numeric, item flags)
    W_fh: np.ndarray  # W_fh without the embedding rows: (features + kept, G·H) float32
    # where the kept columns sit after the features: each numeric input's value (its missing
    # flag next), each table input's "same item" flag (then "seen"), -1 for a categorical
    numeric_at: np.ndarray  # (numeric inputs,) int64
    flags_at: np.ndarray  # (table inputs,) int64


def projection(
    params: Params, weights: CellWeights, n_features: int, specs: Sequence[InputSpec],
    tables: Mapping[str, np.ndarray],
) -> Projection | None:  # fmt: skip
    """The projected tables of a model's table inputs (float64 products, float32 stored), or
    None when it has none or one would exceed PROJECTED_MAX_BYTES (or has the wrong shape)."""
    with_table = [s for s in specs if s.kind != "numeric"]
    W = params.W_x0[params.E.shape[1] :].astype(np.float64)  # W_fh in float64
    width = W.shape[1]
    if not with_table or any(s.buckets * width * 4 > PROJECTED_MAX_BYTES for s in with_table):
        return None
    projected, dropped = [], set()
    for spec, (col, dim) in zip(with_table, table_columns(specs), strict=True):
        table = tables.get(table_name(spec))
        if table is None or table.shape != (spec.buckets, spec.dim):
            return None  # encode_inputs says what is wrong, batch by batch
        rows = W[n_features + col : n_features + col + dim]
        projected.append(np.ascontiguousarray(table.astype(np.float64) @ rows, np.float32))
        dropped.update(range(n_features + col, n_features + col + dim))
    keep = [r for r in range(W.shape[0]) if r not in dropped]
    kept = np.asarray([r - n_features for r in keep if r >= n_features], np.int64)
    offsets = np.cumsum([0] + [len(t) for t in projected[:-1]], dtype=np.int64)
    numeric_at, flags_at, at = [], [], 0
    for spec in specs:
        if spec.kind == "numeric":
            numeric_at.append(at)
            at += spec_width(spec)
        else:
            flags_at.append(at if spec.kind == "item" else -1)
            at += 2 if spec.kind == "item" else 0
    return Projection(np.concatenate(projected), offsets, kept,
                      np.ascontiguousarray(weights.W_fh[keep]), np.array(numeric_at, np.int64),
                      np.array(flags_at, np.int64))  # fmt: skip


@nb.njit(cache=True)
def _projected_inputs(type_in, tables, offsets, type_idx, x_feat, numbers, values, mean, scale,
                      numeric_at, hashes, buckets, width, count_from):  # fmt: skip
    """(x, rows, counts) of a batch in one pass, what model/input_encoding.py's input_parts and
    numpy's gathers give (bit for bit, tests/test_projection.py): x (N, width) float32 the features,
    then the input block's kept columns: each
    numeric input's standardised value and missing flag at its `numeric_at` past them (the
    item flags' columns left 0); rows (N, G) each event's type row plus its tables' projected
    rows (bucket 1 + hash mod (buckets - 1), 0 for a hash < 0); counts (inputs, 2) of the
    events from count_from on: numeric inputs first, (absent, present but not finite), then
    table inputs, (absent, 0). numbers (numeric, N) are the stored values, `values` them
    through their transforms; hashes (table inputs, N)."""
    n, G, F = type_idx.shape[0], type_in.shape[1], x_feat.shape[1]
    n_num = numbers.shape[0]
    rows = np.empty((n, G), np.float32)
    x = np.zeros((n, width), np.float32)
    counts = np.zeros((n_num + hashes.shape[0], 2), np.int64)
    for e in range(n):
        t = type_idx[e]
        for j in range(G):
            rows[e, j] = type_in[t, j]
        for k in range(hashes.shape[0]):
            h = hashes[k, e]
            r = offsets[k] + (0 if h < 0 else 1 + h % (buckets[k] - 1))
            for j in range(G):
                rows[e, j] += tables[r, j]
            if h < 0 and e >= count_from:
                counts[n_num + k, 0] += 1
        for f in range(F):
            x[e, f] = x_feat[e, f]
        for i in range(n_num):
            z = np.float32((values[i, e] - mean[i]) / scale[i])
            at = F + numeric_at[i]
            if np.isfinite(z):
                x[e, at] = z
            else:
                x[e, at + 1] = 1.0
                if e >= count_from:
                    counts[i, 0 if np.isnan(numbers[i, e]) else 1] += 1
    return x, rows, counts


class ScoringModel:
    """A validated model prepared for the kernels, with its type vocabulary; it scores
    calibrated probabilities when the artifact has a calibration, raw scores if asked."""

    def __init__(self, model: Model, version: str | None = None, raw: bool = False) -> None:
        self.model = model
        meta = model.meta
        a = model.arrays
        self.raw = raw  # the head's scores as trained, without the artifact's calibration
        cal = None if raw else calibration_of(meta.model_extra)
        self._knots = with_ends(np.asarray(cal.x), np.asarray(cal.y)) if cal is not None else None
        self.layers = meta.layers
        self.hidden = meta.hidden
        self.version = version or model.version
        self.unknown_index = len(meta.event_types)
        self._type_index = {name: i for i, name in enumerate(meta.event_types)}
        self.cell = meta.cell
        # packed in float64 so the per-type table is exact, then cast to the kernels' float32
        params = pack(a, meta.cell, np.float64)
        # a wide head: the kernels give the deep logit; `headed` adds x_feat's part, then the head
        self._head = HEAD_SIGMOID if meta.head == "sigmoid" else HEAD_IDENTITY
        kernel_head = "identity" if meta.wide_head else meta.head
        self.weights: CellWeights = cell_weights(params, kernel_head)
        # what the kernels get: a plain tuple unboxes faster than the NamedTuple (CellWeights)
        self.kernel_weights = tuple(self.weights)
        self._work = np.empty(0, np.float32)
        # declared inputs (format 2): their columns follow the features in x_feat, and the
        # kernels' W_fh (= W_x0[D:]) holds their rows after the features' rows
        self.inputs = model.inputs
        self.input_names = [s.name for s in self.inputs]
        self.item_inputs = [s.name for s in self.inputs if s.kind == "item"]
        self._tables = {n: np.ascontiguousarray(t, np.float32) for n, t in model.tables().items()}
        self.input_counts: dict[str, InputCounts] = {}  # the last batch's, per input
        self.projection = projection(params, self.weights, len(meta.features), self.inputs,
                                     model.tables())  # fmt: skip
        self._wide = self._wide_weights(params.w_f, len(meta.features), projected=False)
        self._wide_projected = self._wide_weights(params.w_f, len(meta.features), projected=True)
        # the projected path's inputs, worked out once: numeric ones, then those with tables
        self._numeric = [s for s in self.inputs if s.kind == "numeric"]
        self._with_table = [s for s in self.inputs if s.kind != "numeric"]
        self._means = np.array([s.mean for s in self._numeric], np.float64)
        self._scales = np.array([s.scale for s in self._numeric], np.float64)
        self._buckets = np.array([s.buckets for s in self._with_table], np.int64)
        # the kernel's counts rows (numeric, then tables) in declaration order
        grouped = [s.name for s in self._numeric + self._with_table]
        self._count_rows = np.array([grouped.index(n) for n in self.input_names], np.int64)
        self._event_index = np.arange(0, dtype=np.int64)
        # the session memory's floats in the state's rows below the layers': the session
        # features' first, then each session input's statistics (model/artifact.py)
        self._memory_floats, stats_floats = memory_floats(meta)
        self._session_inputs = session_inputs(self.inputs)
        self._has_memory = bool(self._memory_floats or stats_floats)
        self._state_shape = state_shape(meta)  # asked for every batch: worked out once

    @property
    def state_shape(self) -> tuple[int, int]:
        """The shape of one user's state: (layers, hidden); (layers, 2 * hidden) for an LSTM,
        each layer's h then its c, then the session memory's rows, if any (model/artifact.py,
        state_shape)."""
        return self._state_shape

    def type_indices(self, types: Sequence[str]) -> np.ndarray:
        """Embedding row of each event type; unknown types get the reserved last row."""
        get, unknown = self._type_index.get, self.unknown_index
        return np.fromiter((get(t, unknown) for t in types), np.int64, len(types))

    def advance(
        self,
        state: np.ndarray,
        last_ts: np.ndarray,
        slot: np.ndarray,
        type_idx: np.ndarray,
        ts_ms: np.ndarray,
        inputs: Mapping[str, Sequence | Stored] | None = None,
        memory: Mapping[str, ItemMemory] | None = None,
        replayed: int = 0,
    ) -> np.ndarray:
        """Apply events in order to the users' states in place; return one score per event.

        state (U, *state_shape) float32 and last_ts (U,) int64 epoch ms (-1 = no previous
        event) hold one row per distinct user; event e belongs to row slot[e].

        A model that declares inputs (format 2) needs `inputs`: each declared input's raw
        values, one per event (None = absent), or a `Stored` column of them (the stored form a
        history keeps, model/input_encoding.py: the same x_t), and for each item input
        `memory[name]`, the users' item memories (one row per state row), updated in place;
        the session starts that clear it are the ones that reset the state. Each input's
        missing and bad values of the events after the first `replayed` (replays of events
        scored before) are left in `input_counts`. A model without inputs ignores all three.
        """
        meta = self.model.meta
        gap, has_prev = event_gaps(slot, ts_ms, last_ts)
        reset = session_resets(gap, has_prev, meta.session_gap_seconds)
        memory_after, stats = None, None
        if self._has_memory:
            # the session memory sits in the state's rows below the layers'
            rows = state[:, self.layers :, :].reshape(state.shape[0], -1)
            if not np.may_share_memory(rows, state):  # a copy would drop the updates
                raise ValueError("the state must be C-contiguous (users, *state_shape)")
            if self._memory_floats:
                memory_after = advance_memory(slot, type_idx, gap, reset,
                                              rows[:, : self._memory_floats])  # fmt: skip
            stats = self._stats_in(rows)
            state = state[:, : self.layers, :]
        x_feat = feature_matrix(meta.features, gap, memory_after, meta.event_types)
        weights = self.kernel_weights
        projected = bool(self.input_names) and self.projection is not None
        if projected:
            weights, type_idx, x_feat = self._projected(type_idx, x_feat, slot, reset, inputs,
                                                        memory, replayed, stats)  # fmt: skip
        elif self.input_names:
            x_feat = self._with_inputs(x_feat, slot, reset, inputs, memory, replayed, stats)
        scores = np.empty(slot.shape[0], np.float32)
        work = self.scratch(slot.shape[0])
        step_batch(weights, state, slot, type_idx, x_feat, reset, scores, work)
        return self.calibrated(self.headed(scores, x_feat, projected))

    def _stats_in(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Each session input's statistics (U, 4): views of the users' memory rows, after the
        session features' floats."""
        at = self._memory_floats
        return {name: rows[:, at + STATS_FLOATS * i : at + STATS_FLOATS * (i + 1)]
                for i, name in enumerate(self._session_inputs)}  # fmt: skip

    def headed(self, z: np.ndarray, x_feat: np.ndarray, projected: bool = False) -> np.ndarray:
        """The kernels' scores (N,) in place, with a wide head's part of x_feat added and the
        head applied (its kernels run with the identity head); as they are without one.
        `projected`: x_feat is the projected tables' (features, then the kept columns)."""
        wide = self._wide_projected if projected else self._wide
        if wide is not None:
            wide_head(z, x_feat, wide, self._head)
        return z

    def _wide_weights(self, w_f: np.ndarray, n_features: int, projected: bool) -> np.ndarray | None:
        """The wide part's weights in the columns of x_feat as the kernels get it: every
        column, or through projected tables the features and the kept columns; None without
        a wide head."""
        if not w_f.shape[0]:
            return None
        if projected:
            if self.projection is None:
                return None
            w_f = np.concatenate([w_f[:n_features], w_f[n_features + self.projection.kept]])
        return np.ascontiguousarray(w_f, np.float32)

    def _projected(
        self, type_idx, x_feat, slot, reset, inputs, memory, replayed, stats=None
    ) -> tuple:
        """(kernel weights, type rows, x_feat) for a batch through the projected tables: each
        event's layer-0 input row (its type's row plus its tables' projected rows) as the
        kernel's per-type table, indexed by event; x_feat widened by the inputs' numeric and
        flag columns only."""
        if inputs is None:
            raise ValueError(f"the model declares inputs {self.input_names}; none were given")
        proj, n = self.projection, slot.shape[0]
        numeric, with_table = self._numeric, self._with_table
        numbers = np.empty((len(numeric), n), np.float64)
        values = np.empty_like(numbers)
        for i, spec in enumerate(numeric):
            numbers[i] = stored_column(spec, inputs, n)
            values[i] = transformed(spec, numbers[i])
        hashes = np.empty((len(with_table), n), np.int64)
        for k, spec in enumerate(with_table):
            hashes[k] = stored_column(spec, inputs, n)
        x, rows, counts = _projected_inputs(
            self.weights.type_in, proj.tables, proj.offsets, type_idx, x_feat, numbers, values,
            self._means, self._scales, proj.numeric_at, hashes, self._buckets,
            x_feat.shape[1] + len(proj.kept), replayed,
        )  # fmt: skip
        for k, spec in enumerate(with_table):
            if spec.kind != "item":
                continue
            mem = (memory or {}).get(spec.name)
            if mem is None:
                raise ValueError(f"input {spec.name!r}: no item memory given")
            at = x_feat.shape[1] + proj.flags_at[k]
            write_item_flags(x[:, at : at + 2], slot, hashes[k], reset, mem.keys, mem.count)
        for i, spec in enumerate(numeric):
            if spec.session:
                at = x_feat.shape[1] + proj.numeric_at[i]
                write_session_stats(x, at, slot, reset, session_stats_of(spec, stats))
        rows_counts = counts[self._count_rows].tolist()  # in declaration order
        self.input_counts = dict(zip(self.input_names, map(InputCounts._make, rows_counts),
                                     strict=True))  # fmt: skip
        weights = (*self.kernel_weights[:2], rows, proj.W_fh, *self.kernel_weights[4:])
        return weights, self._event_indices(n), x

    def _event_indices(self, n: int) -> np.ndarray:
        """0..n-1 (int64), a view of one array grown on demand (the kernels only read it)."""
        if self._event_index.shape[0] < n:
            self._event_index = np.arange(max(n, 1024), dtype=np.int64)
        return self._event_index[:n]

    def _with_inputs(self, x_feat, slot, reset, inputs, memory, replayed, stats=None) -> np.ndarray:
        """x_feat widened by the declared inputs' block (model/input_encoding.py, encode_inputs)."""
        if inputs is None:
            raise ValueError(f"the model declares inputs {self.input_names}; none were given")
        extra, self.input_counts = encode_inputs(
            self.inputs, self._tables, inputs, slot, reset, memory or {}, replayed, stats
        )
        return np.ascontiguousarray(np.concatenate([x_feat, extra], axis=1))

    def empty_memory(self, n_users: int) -> dict[str, ItemMemory]:
        """Empty item memories of n_users rows for each item input (none without them)."""
        return {name: ItemMemory.empty(n_users) for name in self.item_inputs}

    def calibrated(self, raw: np.ndarray) -> np.ndarray:
        """Raw head scores as the model reports them, in place: through its calibration map
        (model/calibration.py), or as they are for a raw or uncalibrated model."""
        if self._knots is None:
            return raw
        np.copyto(raw, np.interp(raw, *self._knots), casting="same_kind")
        return raw

    def scratch(self, n_events: int) -> np.ndarray:
        """Kernel scratch for a batch of n_events, grown on demand and reused across batches."""
        need = work_size(n_events, self.hidden, self.cell)
        if self._work.shape[0] < need:
            self._work = np.empty(need, np.float32)
        return self._work

    def warm_up(self) -> None:
        """Compile (or load from cache) the kernels now, not on the first real batch: for one
        user and for two (a model with session memory rows slices the state, C-contiguous for
        one user only, so the kernels see two layouts)."""
        for users in (1, 2):
            state = np.zeros((users, *self.state_shape), np.float32)
            slot, zeros = np.arange(users, dtype=np.int64), np.zeros(users, np.int64)
            last_ts = np.full(users, -1, np.int64)
            if not self.input_names:
                self.advance(state, last_ts, slot, zeros, zeros)
                continue
            absent = dict.fromkeys(self.input_names, (None,) * users)
            self.advance(state, last_ts, slot, zeros, zeros, absent, self.empty_memory(users))


class InMemoryScorer:
    """Per-user states (and item memories) kept in dicts: the state store of
    `intentstream score`."""

    def __init__(self, model: ScoringModel) -> None:
        self.model = model
        self._state: dict[str, np.ndarray] = {}
        self._last_ts: dict[str, int] = {}
        # item input -> user -> (keys, count) of the session's items
        self._items: dict[str, dict[str, tuple[np.ndarray, int]]] = {
            name: {} for name in model.item_inputs
        }

    def score(
        self,
        user_ids: Sequence[str],
        types: Sequence[str],
        ts_ms: np.ndarray,
        inputs: Mapping[str, Sequence] | None = None,
    ) -> np.ndarray:
        """Score a batch of events in order, carrying each user's state across calls.

        `inputs` holds each declared input's raw values, one per event (ScoringModel.advance);
        a model without inputs ignores it."""
        users = list(dict.fromkeys(user_ids))
        row = {u: i for i, u in enumerate(users)}
        state = np.zeros((len(users), *self.model.state_shape), np.float32)
        last_ts = np.full(len(users), -1, np.int64)
        for i, u in enumerate(users):
            if u in self._state:
                state[i] = self._state[u]
                last_ts[i] = self._last_ts[u]
        memory = self._memory_of(users) if self._items else {}
        slot = np.fromiter((row[u] for u in user_ids), np.int64, len(user_ids))
        type_idx, ts = self.model.type_indices(types), np.asarray(ts_ms, np.int64)
        if self.model.input_names:
            scores = self.model.advance(state, last_ts, slot, type_idx, ts, inputs, memory)
        else:  # a model without inputs (or a subclass) scores as it always has
            scores = self.model.advance(state, last_ts, slot, type_idx, ts)
        for i, u in enumerate(users):
            self._state[u] = state[i]
            self._last_ts[u] = int(last_ts[i])
        for name, mem in memory.items():
            kept = self._items[name]
            for i, u in enumerate(users):
                kept[u] = (mem.keys[i].copy(), int(mem.count[i]))
        return scores

    def _memory_of(self, users: list[str]) -> dict[str, ItemMemory]:
        """The users' item memories, one row per user (empty for a user not seen yet)."""
        memory = self.model.empty_memory(len(users))
        for name, mem in memory.items():
            kept = self._items[name]
            for i, u in enumerate(users):
                if u in kept:
                    mem.keys[i], mem.count[i] = kept[u]
        return memory
