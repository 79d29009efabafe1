"""Training with declared inputs (issue 22): sessions carry the inputs' columns and table
rows as scoring encodes them, and BPTT fits the input tables."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model.artifact import WIDE_HEAD, load_model, save_model, table_rows
from model.data.rich_shop import rich_shop
from model.inputs import parse_inputs
from model.random_init import random_model
from model.scoring import InMemoryScorer, ScoringModel
from model.training.bptt import loss_and_gradients, predict
from model.training.evaluate import model_step_scores
from model.training.sessions import pad, sessionize
from model.training.train import TrainConfig, train
from tests.conftest import NO_TEST_USERS, run_cli
from tests.statistics_weights import with_statistics_weights
from worker.commands.event_files import read_event_files
from worker.commands.input_flags import absent_inputs_warning, input_coverage
from worker.commands.train import seconds_warning

TYPES = ["view", "cart", "purchase"]
INPUTS = parse_inputs([
    {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 3.0, "scale": 1.5},
    {"kind": "categorical", "name": "brand", "buckets": 5, "dim": 2},
    {"kind": "item", "name": "product_id", "buckets": 4, "dim": 2},
])  # fmt: skip
# the same with the price's session mean, min and max (three columns after its two)
WITH_STATS = parse_inputs([INPUTS[0].model_dump() | {"session": True}, INPUTS[1], INPUTS[2]])


def shop_events(users: int = 5, per_user: int = 9, seed: int = 0, purchases: bool = True):
    """Events with price (some missing or bad), brand (some missing) and repeated products,
    gaps sometimes above the session gap."""
    rng = np.random.default_rng(seed)
    events = []
    for u in range(users):
        ts = 1_000_000
        for _ in range(per_user):
            ts += int(rng.choice([5_000, 60_000, 4_000_000]))
            kinds = TYPES if purchases else TYPES[:2]
            e = {"user_id": f"u{u}", "type": str(rng.choice(kinds, p=None)), "ts": ts}
            r = rng.random()
            if r < 0.7:
                e["price"] = float(np.round(rng.uniform(1, 200), 2))
            elif r < 0.8:
                e["price"] = "n/a"  # bad
            if rng.random() < 0.8:
                e["brand"] = str(rng.choice(["acme", "zeta", "nova"]))
            if rng.random() < 0.85:
                e["product_id"] = int(rng.choice([11, 12, 13]))
            events.append(e)
    return events


def float64_model(cell: str, layers: int = 1, seed: int = 1, wide: bool = False, inputs=INPUTS):
    model = random_model(TYPES, hidden=3, layers=layers, features=["gap"], embedding_dim=2,
                         seed=seed, dtype=np.float64, cell=cell, inputs=inputs,
                         wide_head=wide)  # fmt: skip
    return with_statistics_weights(model, seed)


def test_sessions_hold_the_inputs_columns_and_buckets():
    sessions = sessionize(shop_events(), TYPES, ["gap"], 1800, "purchase", INPUTS)
    assert sessions
    for s in sessions:
        assert s.features.shape == (len(s.types), 1 + 2 + 2 + 4)
        assert s.buckets.shape == (len(s.types), 2)
        assert np.all(s.features[:, 3:5] == 0) and np.all(s.features[:, 5:7] == 0)
    batch = pad(sessions, 1)
    assert batch.buckets.shape == (*batch.types.shape, 2)
    flags = np.concatenate([s.features[:, 7:] for s in sessions])
    assert flags[:, 0].any() and flags[:, 1].any()  # repeats are seen


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize("inputs", [INPUTS, WITH_STATS], ids=["plain", "stats"])
def test_training_scores_are_the_scoring_paths(cell, inputs):
    # no purchase: the sessions tile each user's timeline, so each step is one scored event
    events = shop_events(purchases=False, seed=2)
    model = float64_model(cell, inputs=inputs)
    sessions = sessionize(events, TYPES, ["gap"], 1800, "purchase", inputs)
    if inputs is WITH_STATS:  # the session's mean, min and max of the price follow its two
        stats = np.concatenate([s.features[:, 3:6] for s in sessions])
        assert (stats[:, 1] < stats[:, 0]).any() and (stats[:, 0] < stats[:, 2]).any()
    P = predict(model.arrays, pad(sessions, 1), inputs=inputs)
    ours: dict[str, list[float]] = {}
    for i, s in enumerate(sessions):
        ours.setdefault(s.user_id, []).extend(P[i, : len(s.types)])
    scorer = InMemoryScorer(ScoringModel(model))
    names = [s.name for s in inputs]
    scored = scorer.score(
        [e["user_id"] for e in events], [e["type"] for e in events],
        np.array([e["ts"] for e in events]), {n: [e.get(n) for e in events] for n in names},
    )  # fmt: skip
    for user, mine in ours.items():
        theirs = [p for e, p in zip(events, scored, strict=True) if e["user_id"] == user]
        np.testing.assert_allclose(mine, theirs, atol=2e-5)


@pytest.mark.parametrize("cell", ["rnn", "gru", "lstm"])
@pytest.mark.parametrize(
    ("layers", "wide", "inputs"),
    [(1, False, INPUTS), (2, False, INPUTS), (1, True, INPUTS), (1, True, WITH_STATS)],
    ids=["1", "2", "1-wide", "1-wide-stats"],
)
def test_input_table_gradients_equal_central_differences(cell, layers, wide, inputs):
    model = float64_model(cell, layers, wide=wide, inputs=inputs)
    fixed = set(map(tuple, table_rows(model.meta)[:, None])) if wide else set()
    params = {k: v.copy() for k, v in model.arrays.items()}
    sessions = sessionize(shop_events(users=4, per_user=6), TYPES, ["gap"], 1800, "purchase",
                          inputs)  # fmt: skip
    batch = pad(sessions, 1)
    _, grads = loss_and_gradients(params, batch, bptt=50, inputs=inputs)
    assert set(grads) == set(params)
    assert np.abs(grads["input.brand.embedding"]).max() > 0
    assert np.abs(grads["input.product_id.embedding"]).max() > 0
    if wide:  # the wide part reads the numeric columns; its table-column rows stay 0
        w = grads[WIDE_HEAD]
        assert not w[list(table_rows(model.meta))].any() and w.any()
    eps = 1e-5  # some recurrent gradients are ~1e-5: at 1e-6 rounding takes their digits
    for name, p in params.items():
        numeric = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            if name == WIDE_HEAD and idx[:1] in fixed:
                continue  # not a parameter: the artifact holds these rows at 0
            old = p[idx]
            p[idx] = old + eps
            up, _ = loss_and_gradients(params, batch, bptt=50, inputs=inputs)
            p[idx] = old - eps
            down, _ = loss_and_gradients(params, batch, bptt=50, inputs=inputs)
            p[idx] = old
            numeric[idx] = (up - down) / (2 * eps)
        scale = max(np.abs(numeric).max(), np.abs(grads[name]).max(), 1e-12)
        assert np.abs(numeric - grads[name]).max() / scale < 1e-6, name


def test_a_batch_without_the_models_tables_is_refused():
    model = float64_model("rnn")
    sessions = sessionize(shop_events(), TYPES, ["gap"], 1800, "purchase")
    with pytest.raises(ValueError, match="input table"):
        loss_and_gradients(model.arrays, pad(sessions, 1), inputs=INPUTS)


SHOP_INPUTS = [
    {"kind": "numeric", "name": "price", "transform": "log1p"},
    {"kind": "categorical", "name": "brand", "buckets": 64, "dim": 3},
    {"kind": "item", "name": "product_id", "buckets": 256, "dim": 4},
]


def shop_config(**kw) -> TrainConfig:
    base = {"hidden": 8, "embedding_dim": 4, "epochs": 2, "batch_size": 32, "calibrate": False,
            "min_type_count": 1, "seed": 3}  # fmt: skip
    return TrainConfig(**(base | kw))


def test_a_model_trained_with_inputs_scores_its_validation_sessions_through_the_cli(tmp_path):
    events, _ = rich_shop(users=300, seed=5)
    result = train(events, shop_config(inputs=SHOP_INPUTS))
    model = result.model
    assert [s.name for s in model.inputs] == ["price", "brand", "product_id"]
    price = model.inputs[0]
    # fitted on the training users alone: neither validation nor test users
    valid_users = {s.user_id for s in result.validation_sessions}
    unseen = valid_users | {e["user_id"] for e in result.test_events}
    used = np.array([np.log1p(float(e["price"])) for e in events if e["user_id"] not in unseen])
    if len(used) >= 200:  # the fit's clip of the extremes (fitted_numeric)
        used = np.clip(used, *np.percentile(used, [0.5, 99.5]))
    assert price.mean == pytest.approx(np.mean(used), rel=1e-6)
    assert price.scale == pytest.approx(np.std(used), rel=1e-6)
    assert result.report["inputs"][0]["mean"] == price.mean
    assert result.report["config"]["inputs"][1] == {"kind": "categorical", "name": "brand",
        "transform": "none", "session": False, "buckets": 64, "dim": 3}  # fmt: skip
    untrained = random_model(model.meta.event_types, 8, 1, ["gap"], 4, seed=3, inputs=model.inputs)
    assert not np.allclose(model.arrays["input.brand.embedding"],
                           untrained.arrays["input.brand.embedding"])  # fmt: skip
    path = tmp_path / "model.npz"
    save_model(model, path)
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = run_cli("score", "--model", str(path), str(data))
    assert out.returncode == 0, out.stderr
    scored = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(scored) == len(events)
    theirs: dict[str, list[float]] = {}
    for e, s in zip(events, scored, strict=True):
        if e["user_id"] in valid_users and e["type"] != "purchase":  # the sessions' steps
            theirs.setdefault(e["user_id"], []).append(s["score"])
    P = model_step_scores(model, result.validation_sessions)[1]
    ours: dict[str, list[float]] = {}
    at = 0
    for s in result.validation_sessions:
        ours.setdefault(s.user_id, []).extend(P[at : at + len(s.types)])
        at += len(s.types)
    assert ours.keys() == theirs.keys()
    for user in ours:
        np.testing.assert_allclose(theirs[user], ours[user], atol=2e-5)
    # the inputs carry what the types do not: the trained model beats one on types alone
    typed = train(events, shop_config())
    assert result.report["metrics"]["auc_last"] != typed.report["metrics"]["auc_last"]


def test_fine_tuning_keeps_the_parents_inputs():
    events, _ = rich_shop(users=200, seed=6)
    parent = train(events, shop_config(inputs=SHOP_INPUTS, epochs=1)).model
    child = train(events, shop_config(epochs=1), init=parent).model
    assert child.inputs == parent.inputs


def test_json_lines_data_keep_their_other_scalar_fields(tmp_path):
    data = tmp_path / "e.jsonl"
    data.write_text(
        '{"user_id": "a", "type": "view", "ts": 1000, "price": 9.5, "brand": "acme", '
        '"tags": ["x"], "meta": {"k": 1}}\n\nnot json\n'
        '{"user_id": "b", "type": "view", "event_id": "e1", "product_id": 12}\n'
    )
    events = read_event_files([str(data)])
    assert events == [
        {"user_id": "a", "type": "view", "ts": 1000, "price": 9.5, "brand": "acme"},
        {"user_id": "b", "type": "view", "ts": None, "product_id": 12, "event_id": "e1"},
    ]


def test_the_cli_trains_and_initialises_models_with_inputs(tmp_path):
    events, _ = rich_shop(users=200, seed=7)
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e) + "\n" for e in events))
    out = tmp_path / "m.npz"
    run = run_cli(
        "train", "--data", str(data), "--numeric", "price:log1p:session", "--categorical", "brand",
        "--item", "product_id", "--buckets", "64", "--input-dim", "3", "--hidden", "8",
        "--epochs", "1", "--no-calibrate", "--min-type-count", "1", "--quiet", "--out", str(out),
        *NO_TEST_USERS,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    model = load_model(out)
    assert [(s.kind, s.name) for s in model.inputs] == [
        ("numeric", "price"), ("categorical", "brand"), ("item", "product_id")]  # fmt: skip
    assert model.arrays["input.brand.embedding"].shape == (64, 3)
    assert f"price: numeric, log1p, mean {model.inputs[0].mean:.6g}" in run.stdout
    assert model.inputs[0].session and "with its session mean, min and max" in run.stdout
    spec = tmp_path / "inputs.json"
    spec.write_text(json.dumps([{"kind": "item", "name": "product_id", "buckets": 32, "dim": 2}]))
    run = run_cli("train", "--data", str(data), "--inputs", str(spec), "--hidden", "4",
                  "--epochs", "1", "--no-calibrate", "--min-type-count", "1", "--quiet",
                  "--wide-head", "--out", str(out), *NO_TEST_USERS)  # fmt: skip
    assert run.returncode == 0, run.stderr
    wide = load_model(out)
    assert wide.arrays["input.product_id.embedding"].shape == (32, 2) and wide.meta.wide_head
    assert "wide part: a logistic regression on 3 numeric columns" in run.stdout
    init = tmp_path / "init.npz"
    run = run_cli("model", "init", "--event-types", "view,add_to_cart", "--hidden", "4",
                  "--features", "gap", "--numeric", "price", "--item", "product_id",
                  "--out", str(init))  # fmt: skip
    assert run.returncode == 0, run.stderr
    fresh = load_model(init)
    assert fresh.inputs[0].mean == 0.0 and fresh.inputs[0].scale == 1.0
    assert fresh.arrays["input.product_id.embedding"].shape == (1024, 8)
    scored = run_cli("score", "--model", str(init), str(data))
    assert scored.returncode == 0, scored.stderr
    bad = run_cli("model", "init", "--event-types", "view", "--numeric", "price:sqrt",
                  "--out", str(init))  # fmt: skip
    assert bad.returncode == 2 and "':log1p' (or ':none') and ':session'" in bad.stderr


def test_the_cli_trains_on_numbered_users_and_refuses_an_input_no_event_carries(tmp_path):
    """A shop's export numbers its users (JSON integers: their digits, as Redis carries them);
    a declared input that no event carries (a misspelt name) is named with the fields the
    events do carry, and the report shows each input's share of the events."""
    events, _ = rich_shop(users=150, seed=9)
    numbered = {u: k for k, u in enumerate(dict.fromkeys(e["user_id"] for e in events))}
    data = tmp_path / "events.jsonl"
    data.write_text("".join(json.dumps(e | {"user_id": numbered[e["user_id"]]}) + "\n"
                            for e in events))  # fmt: skip
    out = tmp_path / "m.npz"
    flags = ["--item", "product_id", "--hidden", "4", "--epochs", "1", "--no-calibrate",
             "--min-type-count", "1", "--quiet", "--out", str(out), *NO_TEST_USERS]  # fmt: skip
    misspelt = run_cli("train", "--data", str(data), "--numeric", "prcie", *flags)
    assert misspelt.returncode == 2, misspelt.stderr
    assert "no event carries input(s) prcie" in misspelt.stderr and "price" in misspelt.stderr
    assert len(misspelt.stderr.strip().splitlines()) == 1 and not out.exists()
    run = run_cli("train", "--data", str(data), "--numeric", "price", *flags)
    assert run.returncode == 0, run.stderr
    assert "bad line" not in run.stderr
    share = sum("product_id" in e for e in events) / len(events)
    assert f"product_id: item, 1024 buckets x 8; in {share:.0%} of the events" in run.stdout
    assert "price: numeric, none, mean" in run.stdout and out.exists()


def test_the_input_tables_decay_and_a_type_only_model_is_unchanged():
    from model.params import pack
    from model.training.train import decay_tables

    params = pack(float64_model("rnn").arrays, "rnn", np.float64, INPUTS)
    before, weights = params.tab.copy(), params.W_x0.copy()
    decay_tables(params, 0.05)
    assert np.allclose(params.tab, 0.95 * before) and (params.W_x0 == weights).all()
    events, _ = rich_shop(users=150, seed=3)
    config = TrainConfig(hidden=4, epochs=1, calibrate=False)
    runs = [train(events, config.model_copy(update={"input_weight_decay": d})).model
            for d in (0.0, 50.0)]  # fmt: skip
    assert all((runs[0].arrays[k] == runs[1].arrays[k]).all() for k in runs[0].arrays)
    with pytest.raises(ValueError, match="below 1"):
        TrainConfig(lr=0.1, input_weight_decay=10, inputs=[{"kind": "item", "name": "p"}])


def test_input_coverage_and_the_warnings_of_data_a_model_would_misread():
    events = [{"user_id": "a", "type": "view", "ts": 1_700_000_000_000, "price": 3.0},
              {"user_id": "a", "type": "view", "ts": 1_700_000_001_000, "price": ""},
              {"user_id": "b", "type": "view", "ts": None, "brand": "x"}]  # fmt: skip
    coverage = input_coverage(events, ["price", "sku"])
    assert coverage == {"price": 1 / 3, "sku": 0.0}
    warning = absent_inputs_warning(coverage, events)
    assert "input(s) sku" in warning and "brand, price" in warning
    assert absent_inputs_warning({"price": 0.5}, events) is None
    assert seconds_warning(events) is None
    in_seconds = [e | {"ts": 1_700_000_000 + k} for k, e in enumerate(events)]
    assert "3 of 3 events' ts are before 2000-01-01" in seconds_warning(in_seconds)
    assert seconds_warning([]) is None


def test_a_wide_head_is_fitted_on_its_numeric_columns_and_leaves_the_tables_columns_at_zero():
    events, _ = rich_shop(users=200, seed=6)
    result = train(events, shop_config(inputs=SHOP_INPUTS, wide_head=True))
    model = result.model
    w = model.arrays["head.W_fq"][:, 0]
    fixed = table_rows(model.meta)
    # gap, price (value, missing), brand (3 embedding columns), product (4, then 2 flags)
    assert w.shape == (1 + 2 + 3 + 4 + 2,) and list(fixed) == [3, 4, 5, 6, 7, 8, 9]
    assert not w[fixed].any()
    # the gap, the price and the item flags carry weight; every price is there: its missing
    # flag is a constant column, which the regression leaves at 0
    assert np.abs(w[[0, 1, 10, 11]]).min() > 0 and w[2] == 0
    wide = result.report["wide_part"]
    assert wide["columns_used"] == 4 and wide["scale"] > 0
    assert "averaged with the deep logit" in wide["note"]
    # fine-tuning trains both parts jointly: the table columns stay exactly 0 through Adam,
    # clipping and the tables' decay
    parent = {k: v.copy() for k, v in model.arrays.items()}
    tuned = train(events, shop_config(inputs=SHOP_INPUTS, epochs=1), init=model).model
    w_tuned = tuned.arrays["head.W_fq"][:, 0]
    assert not w_tuned[fixed].any() and not np.array_equal(w_tuned, w)
    # and the parent's arrays are its own still (fine-tuning trains copies)
    assert all(np.array_equal(v, parent[k]) for k, v in model.arrays.items())
    assert train(events, shop_config(inputs=SHOP_INPUTS)).report["wide_part"] is None
