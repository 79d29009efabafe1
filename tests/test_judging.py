"""Judging on held-out users (model/judging/): the session features see only the events up to
the scored one, the folds partition the users, the baselines are fitted and scored on the
same sessions as the model, and the summary's figures are the folds' own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from model.data.rich_shop import rich_shop
from model.judging.baselines import BOOSTED, LOGISTIC, baseline_scores
from model.judging.protocol import (
    MODEL,
    Fold,
    FoldResult,
    StepScores,
    bootstrap_interval,
    calibrated_ece_over,
    fold_metrics,
    judge,
    judge_trained,
    outer_folds,
    paired_bootstrap,
    summary,
)
from model.judging.report import folds_table, heldout_lines, heldout_report
from model.judging.session_features import feature_names, session_rows, step_features
from model.judging.shop_sessions import ShopSession, shop_sessions
from model.training.sessions import is_test_user
from model.training.train import TrainConfig, train

TYPES = ["view", "add_to_cart"]
MIN = 60_000


def ev(user, type_, minute, product=None, price=None, **more):
    e = {"user_id": user, "type": type_, "ts": 1_700_000_000_000 + minute * MIN}
    if product is not None:
        e["product_id"] = product
    if price is not None:
        e["price"] = str(price)
    return e | more


def column(rows: np.ndarray, name: str) -> np.ndarray:
    return rows[:, feature_names(TYPES).index(name)]


def test_sessions_carry_the_users_earlier_sessions_and_purchases() -> None:
    events = [ev("a", "view", 0), ev("a", "purchase", 1), ev("a", "view", 100),
              ev("a", "view", 200), ev("a", "purchase", 201), ev("b", "purchase", 0),
              ev("b", "view", 1)]  # fmt: skip
    got = shop_sessions(events)
    assert [(s.user_id, len(s.events), s.label, s.earlier_sessions, s.earlier_labels)
            for s in got] == [("a", 1, 1.0, 0, 0), ("a", 1, 0.0, 1, 1),
                              ("a", 1, 1.0, 2, 1)]  # fmt: skip
    assert got[1].gap_before == pytest.approx(99 * 60)


def test_features_count_what_happened_up_to_each_step() -> None:
    s = ShopSession("a", [ev("a", "view", 0, "p1", 10), ev("a", "add_to_cart", 1, "p1", 10),
                          ev("a", "view", 3, "p2", 100), ev("a", "view", 4, "p1", 10)],
                    0.0, -1.0)  # fmt: skip
    rows = session_rows(s, TYPES)
    assert rows.shape == (4, len(feature_names(TYPES)))
    assert column(rows, "count_view").tolist() == pytest.approx(np.log1p([1, 1, 2, 3]).tolist())
    assert column(rows, "product_seen_before").tolist() == [0, 1, 0, 1]
    assert column(rows, "product_carted_before").tolist() == [0, 0, 0, 1]
    assert column(rows, "products_carted").tolist() == pytest.approx(
        [0, math.log1p(1)] * 1 + [math.log1p(1)] * 2
    )
    assert column(rows, "last_is_add_to_cart").tolist() == [0, 1, 0, 0]
    assert column(rows, "price_max")[2] == pytest.approx(math.log1p(100))
    assert column(rows, "price_last_minus_mean")[3] == pytest.approx(
        math.log1p(10) - np.mean([math.log1p(10)] * 3 + [math.log1p(100)])
    )
    assert column(rows, "top_product_share").tolist() == pytest.approx([1, 1, 2 / 3, 3 / 4])
    assert column(rows, "gap_before").tolist() == [-1.0] * 4


def test_a_step_never_sees_a_later_event() -> None:
    kinds = ["view", "view", "add_to_cart", "view", "view", "add_to_cart"]
    events = [ev("a", t, m, f"p{m % 3}", 5 + m) for m, t in enumerate(kinds)]
    whole = session_rows(ShopSession("a", events, 1.0, 30.0, 2, 1), TYPES)
    for t in range(1, len(events)):
        prefix = session_rows(ShopSession("a", events[:t], 1.0, 30.0, 2, 1), TYPES)
        assert np.array_equal(prefix, whole[:t])


def test_a_session_without_prices_says_so() -> None:
    rows = session_rows(ShopSession("a", [ev("a", "view", 0)], 0.0, -1.0), TYPES)
    assert column(rows, "price_missing").tolist() == [1.0]
    assert column(rows, "price_mean").tolist() == [0.0]


def test_outer_folds_partition_the_users_in_every_repeat() -> None:
    users = [f"u{i}" for i in range(200)]
    folds = outer_folds(users, 5, repeats=2)
    assert len(folds) == 10
    for r in (0, 1):
        held = [f.test_users for f in folds if f.repeat == r]
        assert set().union(*held) == set(users)
        assert sum(map(len, held)) == len(users)
    assert folds[0].test_users != folds[5].test_users  # another repeat, another cut
    assert outer_folds(users, 5, 2) == folds  # the same on every run


def test_fold_metrics_read_early_steps_of_sessions_that_reach_them() -> None:
    lengths = np.array([1, 3, 3])
    labels = np.array([0.0, 1.0, 0.0])
    every = np.array([0.9, 0.1, 0.2, 0.8, 0.5, 0.6, 0.3])
    m = fold_metrics(lengths, labels, StepScores(every, np.array([0.9, 0.8, 0.3])))
    assert m["auc_step1"] == pytest.approx(0.0)  # 0.1 (buyer) below 0.9 and 0.5
    assert m["auc_step3"] == pytest.approx(1.0)  # 0.8 (buyer) above 0.3
    assert math.isnan(m["auc_step5"])
    assert m["auc_last"] == pytest.approx(0.5)


def test_bootstrap_intervals_hold_the_mean() -> None:
    lo, hi = bootstrap_interval(np.array([0.1, 0.2, 0.3, 0.4]))
    assert lo < 0.25 < hi
    y = np.array([0, 1] * 50, float)
    d, lo, hi = paired_bootstrap(y, y + 0.1, 1 - y)
    assert d == pytest.approx(1.0) and lo <= d <= hi


def _result(index: int, ours: float, theirs: float) -> FoldResult:
    def m(auc: float) -> dict:
        return {k: auc for k in ("auc_last", "auc_all", "auc_step1", "auc_step3", "auc_step5")} | {
            "ece_all": 0.01, "ece_last": 0.01}  # fmt: skip

    return FoldResult(Fold(0, index, frozenset()), 10, 2,
                      {MODEL: m(ours), LOGISTIC: m(theirs), BOOSTED: m(theirs - 0.05)})  # fmt: skip


def test_summary_pairs_the_model_with_the_better_baseline_fold_by_fold() -> None:
    s = summary([_result(0, 0.70, 0.72), _result(1, 0.75, 0.71), _result(2, 0.74, 0.70)])
    p = s["paired"]["auc_last"]
    assert p["against"] == LOGISTIC
    assert p["mean"] == pytest.approx((-0.02 + 0.04 + 0.04) / 3)
    assert (p["ahead"], p["of"]) == (2, 3)
    assert s["paired"]["ece_all"]["ahead"] == 0  # ties are not ahead
    assert "better in 2/3" in folds_table(s)


def _scored_fold(sessions: int, rate: float, length: int, seed: int) -> FoldResult:
    """A fold whose sessions of `length` steps the model scored at `rate` at the last event."""
    rng = np.random.default_rng(seed)
    p = np.clip(rng.normal(rate, rate / 3, sessions), 0.001, 1.0)
    scores = {MODEL: StepScores(np.repeat(p, length), p)}
    lengths = np.full(sessions, length)
    return FoldResult(Fold(0, seed, frozenset()), sessions, 0, {}, scores,
                      (p > rate).astype(float), lengths)  # fmt: skip


def test_the_ece_a_calibrated_scorer_gets_from_label_noise_alone() -> None:
    """Few sessions with long runs of shared labels leave a calibrated scorer's ECE above a
    small bound in many folds (300 sessions of 20 steps at 4%: the observed rate's standard
    deviation is ~0.011); many short sessions in none; the draws are reproducible."""
    few = [_scored_fold(300, 0.04, 20, seed) for seed in range(4)]
    folds_over, none_over = calibrated_ece_over(few, 0.01, draws=50)
    assert 1.0 < folds_over <= 4.0 and none_over < 0.3
    assert calibrated_ece_over(few, 0.01, draws=50) == (folds_over, none_over)
    many = [_scored_fold(20_000, 0.04, 1, seed) for seed in range(4)]
    assert calibrated_ece_over(many, 0.01, draws=50) == (0.0, 1.0)


@pytest.fixture(scope="module")
def shop() -> list[dict]:
    events, _ = rich_shop(400, seed=1)
    return events


@pytest.mark.integration  # fits models for seconds to tens of seconds
def test_baselines_score_the_held_out_sessions_step_by_step(shop) -> None:
    sessions = shop_sessions(shop)
    rows = step_features(sessions, TYPES)
    y = np.array([s.label for s in sessions])
    half = len(sessions) // 2
    for kind in (LOGISTIC, BOOSTED):
        b = baseline_scores(kind, rows[:half], y[:half], rows[half:])
        assert b.last.shape == (len(sessions) - half,)
        assert b.every.shape == (sum(len(r) for r in rows[half:]),)
        assert np.all((b.every >= 0) & (b.every <= 1))


@pytest.mark.integration  # fits models for seconds to tens of seconds
def test_training_holds_test_users_out_of_every_choice(shop) -> None:
    config = TrainConfig(epochs=1, hidden=8, seed=3)
    result = train(shop, config)
    held = {e["user_id"] for e in result.test_events}
    assert held == {e["user_id"] for e in shop if is_test_user(e["user_id"], 0.2, 3)}
    assert held and not held & {s.user_id for s in result.validation_sessions}
    assert result.report["data"]["test_users"] == len(held)
    assert result.report["data"]["users"] == len({e["user_id"] for e in shop})
    judged = judge_trained(result, shop, config)
    report = heldout_report(judged)
    assert set(report["metrics"]) == {MODEL, LOGISTIC, BOOSTED}
    assert report["sessions"] == len([s for s in shop_sessions(shop) if s.user_id in held])
    assert any(line.startswith(f"{MODEL} - {LOGISTIC}") for line in heldout_lines(report))
    none = train(shop, config.model_copy(update={"test_fraction": 0.0}))
    assert none.test_events == [] and judge_trained(none, shop, config) is None


@pytest.mark.integration  # fits models for seconds to tens of seconds
def test_judge_trains_once_per_fold_on_the_other_users(shop) -> None:
    seen: list[set[str]] = []

    def trainer(events, config):
        seen.append({e["user_id"] for e in events})
        return train(events, config).model

    users = sorted({e["user_id"] for e in shop})
    folds = outer_folds(users, 2)
    config = TrainConfig(epochs=1, hidden=8, test_fraction=0.0)
    results = judge(shop, config, folds, log=lambda _: None, trainer=trainer)
    for fold, trained_on, r in zip(folds, seen, results, strict=True):
        assert trained_on == set(users) - fold.test_users
        assert r.sessions == len(r.labels) == len(r.scores[MODEL].last)


@pytest.mark.integration  # trains nine small models
def test_search_tries_each_candidate_once_and_keeps_the_lowest_validation_loss(shop) -> None:
    from model.training.search import candidates, searched

    config = TrainConfig(epochs=1, hidden=8, seed=2)
    assert candidates(config)[0] == config
    as_gru = candidates(config.model_copy(update={"cell": "gru"}))
    # {} and {"cell": "gru"} are one candidate there, and so are the two at hidden 32
    assert len(as_gru) == len(set(map(repr, as_gru))) == len(candidates(config)) - 2
    one = searched(shop, config, seconds=0)  # a spent budget still trains the given one
    assert [r["changes"] for r in one.report["search"]["tried"]] == [{}]
    assert one.report["search"]["untried"] == len(candidates(config)) - 1
    lines: list[str] = []
    every = searched(shop, config, seconds=1e9, log=lines.append)
    tried = every.report["search"]["tried"]
    assert len(tried) == len(lines) == len(candidates(config))
    best = min(tried, key=lambda r: r["validation_loss"])
    assert every.report["search"]["chosen"] == best["changes"]
    assert every.report["kept_epoch"]["validation_loss"] == best["validation_loss"]
    # the candidates share the split: the test users stay out of every one
    assert {e["user_id"] for e in every.test_events} == {e["user_id"] for e in one.test_events}
