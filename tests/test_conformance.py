"""One forward pass, every path: each case's scores through every path that computes them
equal the float64 reference's.

Cases: the golden e-commerce example (docs/contract.md, The model; and its events in another
order), and random Elman, GRU and LSTM models with 1-3 layers, with and without the gap
feature, both heads, session resets and unknown event types, several users interleaved; and
format 2 models declaring inputs (numeric with missing and bad values, categorical, item with
repeats, session resets and a full memory).
Paths: the reference, `step_one`, `step_batch`, `ScoringModel.advance` (in two calls, directly
and through the in-memory scorer), the training forward pass (and its loss), `intentstream
score` (its code in this process; the installed script on two cases), and the worker end to
end on a private Redis (its consumer in this process; a worker process on two cases).
Training does not read declared inputs yet: the format 2 cases go through the other paths.

The oracle derives each event's inputs (gap, reset, type row, the declared inputs' columns)
itself from the model's contract (docs/contract.md, The model), so a mistake in
model/features.py or model/input_encoding.py cannot hide on both sides (only the pinned FNV-1a hash,
model/value_hash.py `value_hash`, is shared).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from model.artifact import Model, save_model, state_shape
from model.calibration import calibration_of
from model.cells.step import step_batch, step_one
from model.item_memory import ITEM_MEMORY
from model.random_init import random_model
from model.reference import reference_step
from model.scoring import InMemoryScorer, ScoringModel
from model.training.bptt import loss_and_gradients, predict
from model.training.sessions import pad, sessionize
from model.value_hash import value_hash
from tests.conftest import run_cli
from tests.golden import GOLDEN_EVENTS, GOLDEN_SCORES, golden_model
from tests.statistics_weights import with_statistics_weights

TYPES = ["view", "search", "add_to_cart", "coupon", "checkout"]
UNKNOWN = ["teleport", "warp"]  # in no model's vocabulary
USERS = ["ann", "bob", "cy", "dee"]
CELLS = ("rnn", "gru", "lstm")
# every session feature, each typed one for every type (model/feature_names.py)
SESSION = ["gap", "session_events", "session_seconds", "earlier_sessions", "gap_before_session",
           *(f"{k}:{t}" for k in ("session_count", "earlier_count") for t in TYPES)]  # fmt: skip
T0 = 1_700_000_000_000


@dataclass(frozen=True)
class Case:
    name: str
    model: Model
    events: tuple[tuple[str, str, int], ...]  # (user_id, type, ts epoch ms) in stream order
    expected: tuple[float, ...] | None = None  # known scores, when the case has them
    # per event, its declared inputs' fields as the producer sends them (a key absent: missing)
    fields: tuple[dict, ...] = field(default=())

    def raw_inputs(self) -> dict[str, list] | None:
        """Each declared input's values, one per event (None where absent)."""
        if not len(self.model.inputs):
            return None
        return {s.name: [f.get(s.name) for f in self.fields] for s in self.model.inputs}


@dataclass(frozen=True)
class Inputs:
    """Each event's kernel inputs, derived from docs/contract.md (The model) by this test, not
    by model code."""

    slot: np.ndarray
    type_idx: np.ndarray
    x_feat: np.ndarray  # (N, F + input width) float32, as the kernels take it
    x64: np.ndarray  # the same in float64, as the reference takes it
    reset: np.ndarray


def golden_cases() -> list[Case]:
    ordered = tuple(("alice", t, T0 + 1000 * i) for i, t in enumerate(GOLDEN_EVENTS))
    other = tuple(("alice", t, T0 + 1000 * i) for i, t in enumerate(reversed(GOLDEN_EVENTS)))
    return [
        Case("golden", golden_model(), ordered, tuple(GOLDEN_SCORES)),
        Case("golden-reversed", golden_model(), other),
    ]


def random_case(cell: str, layers: int, hidden: int, gap: bool, head: str, session_gap: float,
                seed: int, session: bool = False, wide: bool = False) -> Case:  # fmt: skip
    """A random model; `session` gives it every session feature (gap included), `wide` a
    wide head."""
    features = SESSION if session else ["gap"] if gap else []
    model = random_model(
        TYPES, hidden=hidden, layers=layers, features=features,
        embedding_dim=min(8, hidden), head=head, session_gap_seconds=session_gap, seed=seed,
        cell=cell, wide_head=wide,
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    ts = T0 + np.cumsum(rng.integers(1_000, 40_000, 36))
    events = tuple(
        (
            str(rng.choice(USERS)),
            str(rng.choice(UNKNOWN)) if i % 7 == 3 else str(rng.choice(TYPES)),
            int(t),
        )
        for i, t in enumerate(ts)
    )
    feats = "session" if session else "gap" if gap else "nofeat"
    name = f"{cell}-L{layers}-H{hidden}-{feats}-{head}-sg{session_gap:g}"
    return Case(name + ("-wide" if wide else ""), model, events)


def random_cases() -> list[Case]:
    shapes = [  # layers, hidden, gap feature, head, session gap (s)
        (1, 16, False, "sigmoid", 0),
        (1, 5, True, "identity", 90),
        (2, 24, True, "sigmoid", 90),
        (3, 8, False, "identity", 0),
        (2, 3, True, "identity", 60),
    ]
    return [
        random_case(cell, *shape, seed=10 * i + CELLS.index(cell))
        for cell in CELLS
        for i, shape in enumerate(shapes)
    ]


def session_cases() -> list[Case]:
    """Models reading the session memory (extra state rows): hidden widths below and above
    the memory's 16 floats, resets, unknown types."""
    return [
        random_case("rnn", 2, 6, True, "sigmoid", 60, seed=81, session=True),
        random_case("gru", 1, 24, True, "identity", 90, seed=82, session=True),
        random_case("lstm", 2, 4, True, "sigmoid", 60, seed=83, session=True),
    ]


def wide_cases() -> list[Case]:
    """Models with a wide head (the logit also reads x's numeric columns)."""
    return [
        random_case("rnn", 1, 6, True, "sigmoid", 60, seed=91, session=True, wide=True),
        random_case("gru", 2, 5, True, "identity", 90, seed=92, wide=True),
        random_case("lstm", 1, 4, True, "sigmoid", 60, seed=93, session=True, wide=True),
    ]


def calibrated_cases() -> list[Case]:
    """Models whose artifact records a calibration map: every path must score with it."""
    out = []
    for base, (a, b) in zip(
        [random_case("rnn", 2, 12, True, "sigmoid", 90, seed=71),
         random_case("gru", 1, 8, True, "sigmoid", 60, seed=72)],
        # knots inside the scores' range: some scores fall beyond the outer ones
        [([0.42, 0.48, 0.5, 0.56], [0.05, 0.3, 0.6, 0.65]), ([0.47, 0.53], [0.2, 0.4])],
        strict=True,
    ):  # fmt: skip
        extra = {"calibration": {"method": "isotonic", "x": a, "y": b}}
        meta = base.model.meta.model_validate(base.model.meta.model_dump() | extra)
        out.append(Case(f"{base.name}-calibrated", Model(meta, base.model.arrays), base.events))
    return out


# format 2: declared inputs
PRICES = ["12.5", 3, 0.25, "0", "abc", None, "", "-2", "1e400", 199.99, "7"]  # bad: abc, -2, 1e400
BRANDS = ["acme", "globex", "initech", None, "", 42]


def declared(item_buckets: int, stats: bool = False) -> list[dict]:
    return [
        {
            "kind": "numeric",
            "name": "price",
            "transform": "log1p",
            "mean": 2.0,
            "scale": 1.5,
            "session": stats,
        },
        {"kind": "categorical", "name": "brand", "buckets": 5, "dim": 3},
        {"kind": "item", "name": "product", "buckets": item_buckets, "dim": 2},
    ]


def input_case(cell: str, layers: int, hidden: int, head: str, session_gap: float,
               products: int, seed: int, n: int = 48, session: bool = False,
               wide: bool = False, stats: bool = False) -> Case:  # fmt: skip
    """A format 2 model with a numeric (with `stats`, its session statistics), a categorical
    and an item input, and events whose fields repeat items (a pool of `products`), miss
    some, and carry bad prices."""
    model = random_model(
        TYPES, hidden=hidden, layers=layers, features=SESSION if session else ["gap"],
        embedding_dim=min(8, hidden), head=head, session_gap_seconds=session_gap, seed=seed,
        cell=cell, inputs=declared(7 if products < 10 else 61, stats), wide_head=wide,
    )  # fmt: skip
    model = with_statistics_weights(model, seed) if stats else model
    rng = np.random.default_rng(seed)
    ts = T0 + np.cumsum(rng.integers(1_000, 40_000, n))
    events, fields = [], []
    for i, t in enumerate(ts):
        events.append((str(rng.choice(USERS[:3])), str(rng.choice(TYPES)), int(t)))
        f: dict = {}
        if i % 5 != 2:  # some events have no price key at all
            f["price"] = PRICES[int(rng.integers(len(PRICES)))]
        if i % 4 != 1:
            f["brand"] = BRANDS[int(rng.integers(len(BRANDS)))]
        if i % 6 != 4:
            f["product"] = f"p{int(rng.integers(products))}" if i % 9 != 7 else None
        fields.append(f)
    name = f"inputs-{cell}-L{layers}-H{hidden}-{head}-sg{session_gap:g}-items{products}"
    name += ("-session" if session else "") + ("-wide" if wide else "")
    name += "-stats" if stats else ""
    return Case(name, model, tuple(events), fields=tuple(fields))


def input_cases() -> list[Case]:
    return [
        input_case("rnn", 1, 6, "sigmoid", 60, products=4, seed=101),
        input_case("gru", 2, 8, "identity", 90, products=5, seed=102),
        input_case("lstm", 1, 5, "sigmoid", 60, products=3, seed=103),
        input_case("gru", 1, 6, "sigmoid", 60, products=4, seed=105, session=True, stats=True),
        input_case("rnn", 1, 5, "sigmoid", 60, products=4, seed=106, session=True, wide=True),
        input_case("lstm", 2, 4, "identity", 90, products=5, seed=107, wide=True, stats=True),
        # no session resets and many items: the memory fills and drops its oldest (kept last)
        input_case("gru", 1, 4, "sigmoid", 0, products=40, seed=104, n=90),
    ]


CASES = golden_cases() + random_cases() + session_cases() + wide_cases() + calibrated_cases()
IDS = [c.name for c in CASES]
INPUT_CASES = input_cases()
ALL_CASES = CASES + INPUT_CASES
ALL_IDS = [c.name for c in ALL_CASES]


def oracle_numeric(spec, value) -> tuple[float, float]:
    """(standardised value, missing flag) of one numeric value, by the contract."""
    if value is None or value == "":
        return 0.0, 1.0
    if isinstance(value, bool):
        return 0.0, 1.0
    try:
        v = float(value)
    except ValueError:
        return 0.0, 1.0
    if spec.transform == "log1p":
        v = math.log1p(v) if v > -1 else math.nan
    z = (v - spec.mean) / spec.scale
    return (z, 0.0) if math.isfinite(z) else (0.0, 1.0)


def oracle_bucket(spec, value) -> int:
    """Bucket 0 for a missing value, else 1 + hash mod (buckets - 1)."""
    if value is None or value == "":
        return 0
    return 1 + value_hash(spec.name, str(value)) % (spec.buckets - 1)


def oracle_extra(case: Case, reset: list[bool]) -> np.ndarray:
    """The declared inputs' columns of every event (N, input width) in float64, the item
    flags from a plain list per user of the session's items (most recent last), a numeric
    input's session mean, min and max from a plain list of the session's present values."""
    model = case.model
    rows = []
    session_items: dict[str, list[str]] = {}
    session_values: dict[str, list[float]] = {}
    for e, (u, _, _) in enumerate(case.events):
        row: list[float] = []
        for spec in model.inputs:
            value = case.fields[e].get(spec.name)
            if spec.kind == "numeric":
                z, missing = oracle_numeric(spec, value)
                row += [z, missing]
                if spec.session:
                    values = session_values.setdefault(u, [])
                    if reset[e]:
                        values.clear()
                    values += [] if missing else [z]
                    row += (
                        [sum(values) / len(values), min(values), max(values)]
                        if values
                        else [0.0] * 3
                    )
                continue
            table = model.arrays[f"input.{spec.name}.embedding"]
            row += list(np.asarray(table[oracle_bucket(spec, value)], np.float64))
            if spec.kind == "item":
                items = session_items.setdefault(u, [])
                if reset[e]:
                    items.clear()
                if value is None or value == "":
                    row += [0.0, 0.0]
                    continue
                row += [float(bool(items) and items[-1] == value), float(value in items)]
                if value in items:
                    items.remove(value)
                items.append(value)
                del items[:-ITEM_MEMORY]
        rows.append(row)
    return np.array(rows, np.float64).reshape(len(case.events), -1)


def oracle_session(m: dict, type_: str, gap: float, reset: bool) -> dict[str, float]:
    """A user's running session values after an event, by the contract (model/features.py's
    docstring): counts and seconds of this session, its gap, and the sessions before it, each
    kept in float32 (a row of the state)."""
    if not m:
        m.update(events=0, seconds=0.0, sessions=0, gap_before=0.0, now={}, before={})
    if reset:
        for k, n in m["now"].items():
            m["before"][k] = m["before"].get(k, 0) + n
        m.update(events=0, seconds=0.0, now={}, gap_before=float(np.float32(gap)),
                 sessions=m["sessions"] + 1)  # fmt: skip
    elif m["events"]:
        m["seconds"] = float(np.float32(m["seconds"] + gap))  # kept in float32, as the state
    m["events"] += 1
    m["now"][type_] = m["now"].get(type_, 0) + 1
    out = {"session_events": m["events"], "session_seconds": m["seconds"],
           "earlier_sessions": m["sessions"], "gap_before_session": m["gap_before"]}  # fmt: skip
    for t in TYPES:
        out[f"session_count:{t}"] = m["now"].get(t, 0)
        out[f"earlier_count:{t}"] = m["before"].get(t, 0)
    return out


def inputs_of(case: Case) -> Inputs:
    """Gap feature log1p(seconds since the user's previous event), resets past the gap."""
    meta = case.model.meta
    index = {t: i for i, t in enumerate(meta.event_types)}
    users = list(dict.fromkeys(u for u, _, _ in case.events))
    last: dict[str, int] = {}
    memory: dict[str, dict] = {}
    feats, reset = [], []
    for u, t, ts in case.events:
        gap = (ts - last[u]) / 1000.0 if u in last else 0.0
        reset.append(u in last and meta.session_gap_seconds > 0 and gap > meta.session_gap_seconds)
        values = oracle_session(memory.setdefault(u, {}), t, gap, reset[-1])
        feats.append([math.log1p(gap if n == "gap" else values[n]) for n in meta.features])
        last[u] = ts
    # the gap feature as the kernels and training get it (float32); the inputs' columns exact
    x64 = (
        np.array(feats, np.float32).reshape(len(case.events), len(meta.features)).astype(np.float64)
    )
    if len(case.model.inputs):
        x64 = np.concatenate([x64, oracle_extra(case, reset)], axis=1)
    return Inputs(
        slot=np.array([users.index(u) for u, _, _ in case.events], np.int64),
        type_idx=np.array([index.get(t, len(index)) for _, t, _ in case.events], np.int64),
        x_feat=np.ascontiguousarray(x64, np.float32),
        x64=x64,
        reset=np.array(reset, np.bool_),
    )


def reference_scores(case: Case) -> np.ndarray:
    meta, x = case.model.meta, inputs_of(case)
    h = np.zeros((len(USERS) + 1, meta.layers, state_shape(meta)[1]))  # an LSTM's: h, then c
    out = []
    for e, s in enumerate(x.slot):
        if x.reset[e]:
            h[s] = 0.0
        h[s], score = reference_step(
            case.model.arrays, h[s], int(x.type_idx[e]), x.x64[e], meta.head, meta.cell,
        )  # fmt: skip
        out.append(score)
    cal = (meta.model_extra or {}).get("calibration")
    if cal is None:
        return np.array(out)
    # the recorded map: linear through (0, 0), the knots and (1, 1)
    return np.interp(np.array(out), [0.0, *cal["x"], 1.0], [0.0, *cal["y"], 1.0])


def via_step_one(case: Case) -> np.ndarray:
    sm, x = ScoringModel(case.model), inputs_of(case)
    h = np.zeros((len(USERS), sm.layers, sm.state_shape[1]), np.float32)  # the layers' rows
    raw = np.array([
        step_one(sm.weights, h[s], x.type_idx[e], x.x_feat[e], x.reset[e])
        for e, s in enumerate(x.slot)
    ], np.float32)  # fmt: skip
    # the kernels' raw head (a wide head's part added), then the artifact's map
    return sm.calibrated(sm.headed(raw, x.x_feat))


def via_step_batch(case: Case) -> np.ndarray:
    sm, x = ScoringModel(case.model), inputs_of(case)
    state = np.zeros((len(USERS), sm.layers, sm.state_shape[1]), np.float32)
    scores = np.empty(len(x.slot), np.float32)
    step_batch(sm.kernel_weights, state, x.slot, x.type_idx, x.x_feat, x.reset, scores,
               sm.scratch(len(x.slot)))  # fmt: skip
    return sm.calibrated(sm.headed(scores, x.x_feat))


def via_advance(case: Case) -> np.ndarray:
    """ScoringModel.advance (through the in-memory scorer), the events in two calls."""
    scorer = InMemoryScorer(ScoringModel(case.model))
    users = [u for u, _, _ in case.events]
    types = [t for _, t, _ in case.events]
    ts = np.array([t for _, _, t in case.events], np.int64)
    raw = case.raw_inputs()
    half = len(users) // 2

    def part(sl: slice) -> dict | None:
        return None if raw is None else {k: v[sl] for k, v in raw.items()}

    return np.concatenate([
        scorer.score(users[:half], types[:half], ts[:half], part(slice(None, half))),
        scorer.score(users[half:], types[half:], ts[half:], part(slice(half, None))),
    ])  # fmt: skip


def via_advance_direct(case: Case) -> np.ndarray:
    """ScoringModel.advance itself, the events in two calls, states, clocks and item memories
    carried between them."""
    sm = ScoringModel(case.model)
    users = list(dict.fromkeys(u for u, _, _ in case.events))
    slot = np.array([users.index(u) for u, _, _ in case.events], np.int64)
    type_idx = sm.type_indices([t for _, t, _ in case.events])
    ts = np.array([t for _, _, t in case.events], np.int64)
    state = np.zeros((len(users), *sm.state_shape), np.float32)
    last_ts = np.full(len(users), -1, np.int64)
    memory = sm.empty_memory(len(users))
    raw = case.raw_inputs()
    out = []
    for sl in (slice(None, len(slot) // 3), slice(len(slot) // 3, None)):
        part = None if raw is None else {k: v[sl] for k, v in raw.items()}
        out.append(sm.advance(state, last_ts, slot[sl], type_idx[sl], ts[sl], part, memory))
    return np.concatenate(out)


def training_batch(case: Case):
    """The case's events as training sessions (no label event: every session negative), and
    for each event its (session, step)."""
    meta = case.model.meta
    events = [{"user_id": u, "type": t, "ts": ts} for u, t, ts in case.events]
    sessions = sessionize(events, meta.event_types, meta.features, meta.session_gap_seconds,
                          label_type="no-such-type")  # fmt: skip
    # sessionize lists each user's sessions in order, users in order of first appearance
    where, seen = {}, dict.fromkeys(u for u, _, _ in case.events)
    row = 0
    for u in seen:
        steps = [i for i, (v, _, _) in enumerate(case.events) if v == u]
        while steps:
            n = len(sessions[row].types)
            for k, e in enumerate(steps[:n]):
                where[e] = (row, k)
            steps, row = steps[n:], row + 1
    assert row == len(sessions)
    return pad(sessions, len(meta.features)), [where[e] for e in range(len(case.events))]


def via_training(case: Case, dtype: type = np.float64) -> np.ndarray:
    """The training forward pass (model/training/bptt.py's predict): float64 as evaluation runs it,
    float32 as training runs it."""
    batch, where = training_batch(case)
    params = {k: v.astype(dtype) for k, v in case.model.arrays.items()}
    P = predict(params, batch, head=case.model.meta.head, cell=case.model.meta.cell)
    scores = np.array([P[i, k] for i, k in where])
    cal = calibration_of(case.model.meta.model_extra)  # as evaluation applies it
    return cal.apply(scores) if cal is not None else scores


IN_PROCESS = {
    "step_one": (via_step_one, 2e-5),
    "step_batch": (via_step_batch, 2e-5),
    "advance": (via_advance, 2e-5),
    "advance-direct": (via_advance_direct, 2e-5),
    "training": (via_training, 1e-10),
    "training-float32": (lambda case: via_training(case, np.float32), 2e-5),
}


def test_cases_cover_what_they_claim():
    kinds = {(c.model.meta.cell, c.model.meta.layers) for c in CASES}
    assert kinds >= {(cell, n) for cell in CELLS for n in (1, 2, 3)}
    for cell in CELLS:
        mine = [c for c in CASES if c.model.meta.cell == cell and "golden" not in c.name]
        assert {c.model.meta.head for c in mine} == {"sigmoid", "identity"}
        assert {bool(c.model.meta.features) for c in mine} == {True, False}
        assert any(len(c.model.meta.features) > 1 for c in mine)  # the session features
        assert any(inputs_of(c).reset.any() for c in mine)
        assert all(any(t in UNKNOWN for _, t, _ in c.events) for c in mine)
        assert all(len({u for u, _, _ in c.events}) > 1 for c in mine)


def test_input_cases_cover_what_they_claim():
    """Every kind of input, missing and bad numbers, item repeats, resets and a full memory."""
    assert {c.model.meta.cell for c in INPUT_CASES} == set(CELLS)
    for c in INPUT_CASES:
        assert c.model.meta.format == "intentstream.model/2"
        assert {s.kind for s in c.model.inputs} == {"numeric", "categorical", "item"}
        if c.model.inputs[0].session:  # a session's minimum, maximum and mean differ
            stats = inputs_of(c).x64[:, len(c.model.meta.features) + 2 :][:, :3]
            assert (stats[:, 1] < stats[:, 0]).any() and (stats[:, 0] < stats[:, 2]).any()
        assert len({u for u, _, _ in c.events}) > 1
        prices = [f.get("price") for f in c.fields]
        assert None in prices and "" in prices and any("price" not in f for f in c.fields)
        assert {"abc", "-2", "1e400"} & set(prices)
        x = inputs_of(c)
        same, seen = x.x64[:, -2], x.x64[:, -1]
        assert (seen > same).any()  # a repeat of an item seen earlier in the session
        if c is not INPUT_CASES[-1]:
            assert same.any()  # a repeat of the item just before
    assert sum(c.model.inputs[0].session for c in INPUT_CASES) == 2
    resets = [inputs_of(c).reset.any() for c in INPUT_CASES]
    assert any(resets) and not all(resets)
    long = INPUT_CASES[-1]
    per_user = {}
    for (u, _, _), f in zip(long.events, long.fields, strict=True):
        if f.get("product"):
            per_user.setdefault(u, set()).add(f["product"])
    assert max(map(len, per_user.values())) > ITEM_MEMORY  # the memory drops its oldest


@pytest.mark.parametrize("case", [c for c in CASES if c.expected], ids=lambda c: c.name)
def test_reference_gives_the_known_scores(case):
    np.testing.assert_allclose(reference_scores(case), case.expected, atol=1e-5)


def test_order_of_events_changes_the_golden_score():
    ordered, reversed_ = (reference_scores(c)[-1] for c in golden_cases())
    assert abs(ordered - reversed_) > 1e-3


SCORING_PATHS = ("step_one", "step_batch", "advance", "advance-direct")  # read declared inputs


@pytest.mark.parametrize(
    ("case", "path"),
    [pytest.param(c, p, id=f"{c.name}-{p}") for c in CASES for p in IN_PROCESS]
    + [pytest.param(c, p, id=f"{c.name}-{p}") for c in INPUT_CASES for p in SCORING_PATHS],
)
def test_path_equals_the_reference(case, path):
    compute, tol = IN_PROCESS[path]
    np.testing.assert_allclose(compute(case), reference_scores(case), rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "case",
    [c for c in CASES if c.model.meta.head == "sigmoid" and "calibrated" not in c.name],
    ids=lambda c: c.name,
)  # the loss is the raw head's, which training fits; the map is fitted after it
def test_training_loss_is_the_reference_log_loss(case):
    """The loss training minimises (and promotion compares) is the reference's per-step BCE,
    also when the windows are shorter than the sessions (state carried across them)."""
    batch, _ = training_batch(case)
    params = {k: v.astype(np.float64) for k, v in case.model.arrays.items()}
    p = reference_scores(case)  # every session is negative: loss = mean -log(1 - p)
    for bptt in (2, 35):
        loss, _ = loss_and_gradients(params, batch, bptt=bptt, cell=case.model.meta.cell)
        assert loss == pytest.approx(float(np.mean(-np.log1p(-p))), rel=1e-10)


def write_model(case: Case, directory: Path) -> Path:
    path = directory / f"{case.name}.npz"
    save_model(case.model, path)
    return path


def event_lines(case: Case) -> list[str]:
    """The case's events as JSON lines, each with its declared inputs' fields at top level."""
    fields = case.fields or ({},) * len(case.events)
    return [
        json.dumps({"user_id": u, "type": t, "ts": ts, **f})
        for (u, t, ts), f in zip(case.events, fields, strict=True)
    ]


def assert_score_lines_are_the_reference(case: Case, stdout: str) -> None:
    rows = [json.loads(line) for line in stdout.splitlines()]
    assert [(r["user_id"], r["type"]) for r in rows] == [(u, t) for u, t, _ in case.events]
    got = np.array([r["score"] for r in rows])
    np.testing.assert_allclose(got, reference_scores(case), rtol=2e-5, atol=2e-5)


# The cases the installed script runs, in a process of its own (~1 s of CPU each: the console
# script is checked on these); every case runs the command's code in this process.
SCRIPT_CASES = [CASES[0], INPUT_CASES[0]]  # the golden model; a model declaring inputs


@pytest.mark.parametrize("case", ALL_CASES, ids=ALL_IDS)
def test_the_score_command_equals_the_reference(case, tmp_path, capsys):
    """`intentstream score`'s code (cli.main, from the parsing on) for every case."""
    from worker.commands.cli import main

    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(event_lines(case)))
    code = main(["score", "--model", str(write_model(case, tmp_path)), str(events)])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert_score_lines_are_the_reference(case, out.out)


@pytest.mark.integration
@pytest.mark.parametrize("case", SCRIPT_CASES, ids=lambda c: c.name)
def test_intentstream_score_equals_the_reference(case, tmp_path):
    lines = event_lines(case)
    out = run_cli("score", "--model", str(write_model(case, tmp_path)), stdin="\n".join(lines))
    assert out.returncode == 0, out.stderr
    assert_score_lines_are_the_reference(case, out.stdout)


@pytest.fixture(scope="module")
def shared_redis():
    """One private redis-server for the worker cases; each case has its own key prefix."""
    from worker.common.local_redis import LocalRedis

    server = LocalRedis().start()
    try:
        yield server
    finally:
        server.close()


def published(case: Case, client, prefix: str) -> None:
    """The case's events on partition 0's stream, by plain XADD as a producer sends them."""
    for e, (u, t, ts) in enumerate(case.events):
        fields = ["user_id", u, "type", t, "ts", ts]
        for name, value in (case.fields[e] if case.fields else {}).items():
            if value is not None:  # a producer omits a null field
                fields += [name, value if isinstance(value, str) else json.dumps(value)]
        client.execute_command("XADD", f"{prefix}:events:{{0}}", "*", *fields)


def assert_scores_are_the_reference(case: Case, client, prefix: str) -> None:
    from tests.workers import score_entries

    rows = score_entries(client, prefix=prefix)
    assert len(rows) == len(case.events)
    expected = reference_scores(case)
    # each user's scores come out in that user's order; match them user by user
    for user in {u for u, _, _ in case.events}:
        mine = [i for i, (u, _, _) in enumerate(case.events) if u == user]
        got = [float(row["score"]) for row in rows if row["user_id"] == user]
        np.testing.assert_allclose(got, expected[mine], rtol=2e-5, atol=2e-5, err_msg=user)


@pytest.mark.integration
@pytest.mark.parametrize("case", ALL_CASES, ids=ALL_IDS)
def test_the_workers_consumer_end_to_end_equals_the_reference(case, shared_redis, tmp_path):
    """The worker's loop (its Consumer, in this process: a worker process costs ~1.5 s of CPU
    to start) for every case, through Redis."""
    from tests.consumers import in_process_consumer
    from tests.workers import wait_for
    from worker.common.connection import connect

    prefix = f"conf-in-{case.name}"
    r = connect(shared_redis.url)
    published(case, r, prefix)
    consumer = in_process_consumer(shared_redis.url, write_model(case, tmp_path), prefix=prefix)
    try:
        scores = f"{prefix}:scores:{{0}}"
        wait_for(lambda: consumer.tick() or r.xlen(scores) >= len(case.events), what="scores")
    finally:
        consumer.close()
    assert_scores_are_the_reference(case, r, prefix)


@pytest.mark.integration
@pytest.mark.parametrize("case", SCRIPT_CASES, ids=lambda c: c.name)
def test_worker_end_to_end_equals_the_reference(case, shared_redis, tmp_path):
    from tests.workers import WorkerProcess, wait_for
    from worker.common.connection import connect

    prefix = f"conf-{case.name}"
    r = connect(shared_redis.url)
    published(case, r, prefix)
    worker = WorkerProcess(shared_redis.url, write_model(case, tmp_path), tmp_path / "w.log",
                           "--prefix", prefix)  # fmt: skip
    worker.start()
    try:
        wait_for(lambda: r.xlen(f"{prefix}:scores:{{0}}") >= len(case.events), what="scores")
    finally:
        assert worker.terminate() == 0, worker.log()
    assert_scores_are_the_reference(case, r, prefix)


@pytest.mark.integration
@pytest.mark.parametrize("case", calibrated_cases(), ids=lambda c: c.name)
def test_the_raw_score_stays_available(case, tmp_path):
    """`intentstream score --raw` (and the worker's raw-scores setting, the same flag to
    ScoringModel) scores with the head as trained."""
    lines = [json.dumps({"user_id": u, "type": t, "ts": ts}) for u, t, ts in case.events]
    path = write_model(case, tmp_path)
    out = run_cli("score", "--raw", "--model", str(path), stdin="\n".join(lines))
    assert out.returncode == 0, out.stderr
    got = np.array([json.loads(line)["score"] for line in out.stdout.splitlines()])
    meta = case.model.meta.model_validate(
        {k: v for k, v in case.model.meta.model_dump().items() if k != "calibration"}
    )
    raw_case = Case(case.name, Model(meta, case.model.arrays), case.events)
    np.testing.assert_allclose(got, reference_scores(raw_case), rtol=2e-5, atol=2e-5)
    assert np.abs(got - reference_scores(case)).max() > 1e-3  # and it is not the calibrated


@pytest.mark.integration
def test_intentstream_score_keeps_each_lines_inputs_past_bad_and_blank_lines(tmp_path):
    """The declared fields stay with their event across batches, blank and bad lines; a
    format 1 model ignores the extra keys."""
    case = INPUT_CASES[0]
    lines = event_lines(case)
    for at in (30, 17, 5):
        lines[at:at] = ["", "{not json", json.dumps({"type": "view", "price": "1"}), "[1]"]
    path = write_model(case, tmp_path)
    out = run_cli("score", "--batch-size", "7", "--model", str(path), stdin="\n".join(lines))
    assert out.returncode == 1, out.stderr  # the bad lines are reported and skipped
    got = np.array([json.loads(line)["score"] for line in out.stdout.splitlines()])
    np.testing.assert_allclose(got, reference_scores(case), rtol=2e-5, atol=2e-5)
    plain = Case("plain", random_case("gru", 1, 8, True, "sigmoid", 60, seed=5).model, case.events)
    out = run_cli("score", "--model", str(write_model(plain, tmp_path)), stdin="\n".join(lines))
    got = np.array([json.loads(line)["score"] for line in out.stdout.splitlines()])
    np.testing.assert_allclose(got, reference_scores(plain), rtol=2e-5, atol=2e-5)


def test_a_model_with_inputs_refuses_a_batch_without_them():
    sm = ScoringModel(INPUT_CASES[0].model)
    one = np.zeros(1, np.int64)
    state = np.zeros((1, *sm.state_shape), np.float32)
    with pytest.raises(ValueError, match=r"declares inputs \['price', 'brand', 'product'\]"):
        sm.advance(state, np.full(1, -1, np.int64), one, one, one)
    partial = {"price": ["1"], "brand": ["acme"]}
    with pytest.raises(ValueError, match=r"input 'product': 1 values expected, got none"):
        sm.advance(state, np.full(1, -1, np.int64), one, one, one, partial, sm.empty_memory(1))
    given = partial | {"product": ["p1"]}
    with pytest.raises(ValueError, match=r"input 'product': no item memory given"):
        sm.advance(state, np.full(1, -1, np.int64), one, one, one, given)
