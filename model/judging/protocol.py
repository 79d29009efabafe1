"""The judging protocol: outer folds of users; in each, the recurrent model is trained on the
other users (its early stopping and calibration on its own validation users among them), the
baselines are fitted on the same users, and all are scored on the fold's users, which no
choice saw. Metrics per fold, then means with bootstrap intervals over folds and paired
differences against the best baseline.

    folds = outer_folds(users, k=5, repeats=2)
    result = judge(events, config, folds)
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from model.calibration import expected_calibration_error
from model.judging.baselines import BOOSTED, LOGISTIC, StepScores, baseline_scores
from model.judging.session_features import step_features
from model.judging.shop_sessions import ShopSession, shop_sessions
from model.training.config import TrainConfig
from model.training.evaluate import model_step_scores, roc_auc
from model.training.prepare import vocabulary
from model.training.sessions import DataError, is_test_user, sessionize
from model.training.train import train

MODEL = "intentstream"
EARLY_STEPS = (1, 3, 5)
METRICS = ("auc_last", "auc_all", *(f"auc_step{k}" for k in EARLY_STEPS), "ece_all", "ece_last")


@dataclass(frozen=True)
class Fold:
    """One outer fold: its repeat, its index and its held-out users."""

    repeat: int
    index: int
    test_users: frozenset[str]


def outer_folds(users: Sequence[str], k: int, repeats: int = 1) -> list[Fold]:
    """K folds of users per repeat, each user in one fold of each repeat (a hash of the
    repeat and the user id: the same folds on every machine)."""
    folds = []
    for r in range(repeats):
        parts: list[set[str]] = [set() for _ in range(k)]
        for u in users:
            parts[zlib.crc32(f"fold{r}:{u}".encode()) % k].add(u)
        folds += [Fold(r, i, frozenset(p)) for i, p in enumerate(parts)]
    return folds


def fold_metrics(sessions_len: np.ndarray, labels: np.ndarray, s: StepScores) -> dict[str, float]:
    """AUC at the last step, over all steps and at early steps (sessions that reach step k,
    scored after their k-th event), ECE over all steps and at the last."""
    every_y = np.repeat(labels, sessions_len)
    starts = np.concatenate([[0], np.cumsum(sessions_len)[:-1]])
    out = {"auc_last": roc_auc(labels, s.last), "auc_all": roc_auc(every_y, s.every)}
    for k in EARLY_STEPS:
        reach = sessions_len >= k
        out[f"auc_step{k}"] = roc_auc(labels[reach], s.every[starts[reach] + k - 1])
    out["ece_all"] = expected_calibration_error(every_y, s.every)
    out["ece_last"] = expected_calibration_error(labels, s.last)
    return out


@dataclass
class FoldResult:
    """One fold's figures per scorer, its sizes and the pooled held-out scores."""

    fold: Fold
    sessions: int
    positive: int
    metrics: dict[str, dict[str, float]]
    scores: dict[str, StepScores] = field(repr=False, default_factory=dict)
    labels: np.ndarray | None = field(repr=False, default=None)
    lengths: np.ndarray | None = field(repr=False, default=None)
    seconds: float = 0.0


def _model_scores(model, test_events: list[dict], label_type: str) -> StepScores:
    m = model.meta
    sessions = sessionize(test_events, m.event_types, m.features, m.session_gap_seconds,
                          label_type, model.inputs)  # fmt: skip
    _, all_p, _, last_p = model_step_scores(model, sessions)
    return StepScores(np.asarray(all_p, np.float64), np.asarray(last_p, np.float64))


def judge_fold(
    events: list[dict], shop: list[ShopSession], rows: list[np.ndarray], fold: Fold,
    config: TrainConfig, trainer: Callable | None = None,
) -> FoldResult:  # fmt: skip
    """Train on the users outside the fold, score the fold's users: the model and both
    baselines, on the same sessions."""
    t0 = time.time()
    held = fold.test_users
    train_events = [e for e in events if e["user_id"] not in held]
    test_events = [e for e in events if e["user_id"] in held]
    tr = [i for i, s in enumerate(shop) if s.user_id not in held]
    te = [i for i, s in enumerate(shop) if s.user_id in held]
    labels = np.array([shop[i].label for i in te])
    lengths = np.array([len(shop[i].events) for i in te])
    if len(set(labels.tolist())) < 2:
        raise DataError(f"fold {fold.index}: its users hold a single class; use fewer folds")
    model = (trainer or (lambda ev, cfg: train(ev, cfg).model))(train_events, config)
    scores = {MODEL: _model_scores(model, test_events, config.label_type)}
    if len(scores[MODEL].last) != len(te):
        raise AssertionError("the model's held-out sessions are not the baselines'")
    train_y = np.array([shop[i].label for i in tr])
    for kind in (LOGISTIC, BOOSTED):
        scores[kind] = baseline_scores(kind, [rows[i] for i in tr], train_y,
                                       [rows[i] for i in te], config.seed)  # fmt: skip
    metrics = {name: fold_metrics(lengths, labels, s) for name, s in scores.items()}
    return FoldResult(fold, len(te), int(labels.sum()), metrics, scores, labels, lengths,
                      time.time() - t0)  # fmt: skip


def judge_trained(result, events: list[dict], config: TrainConfig) -> FoldResult | None:
    """A training run's model and the baselines (fitted on every user training read) on its
    test users (`TrainResult.test_events`); None when it held none out or they hold a single
    class."""
    held = frozenset(e["user_id"] for e in result.test_events)
    return judge_model(result.model, events, held, config)


def judge_model(model, events: list[dict], held: frozenset[str],
                config: TrainConfig) -> FoldResult | None:  # fmt: skip
    """A trained model and the baselines, fitted on the events' other users, on the `held`
    users' sessions (config: the session gap, label type and seed); None when there are none
    or they hold a single class."""
    if not held:
        return None
    shop = shop_sessions(events, config.session_gap_seconds, config.label_type)
    labels = {s.label for s in shop if s.user_id in held}
    if labels != {0.0, 1.0} or all(s.user_id in held for s in shop):
        return None
    rows = step_features(shop, list(model.meta.event_types))
    return judge_fold(events, shop, rows, Fold(0, 0, held), config,
                      trainer=lambda _events, _config: model)  # fmt: skip


def held_out_of(model, events: list[dict]) -> tuple[frozenset[str], TrainConfig] | None:
    """The users of `events` a model's training held out as test users (its meta's
    `train_config`: seed and test fraction), and that config; None for a model trained
    without test users or by hand."""
    raw = (model.meta.model_extra or {}).get("train_config")
    try:
        config = TrainConfig.model_validate(raw) if raw else None
    except ValueError:
        return None
    if config is None or not config.test_fraction:
        return None
    users = {e["user_id"] for e in events}
    held = frozenset(u for u in users if is_test_user(u, config.test_fraction, config.seed))
    return held, config


def paired_bootstrap(
    labels: np.ndarray, a: np.ndarray, b: np.ndarray, draws: int = 1000, seed: int = 0
) -> tuple[float, float, float]:
    """AUC(a) - AUC(b) on the same sessions, and its 95% interval from resampling the
    sessions (both scorers on every draw)."""
    rng = np.random.default_rng(seed)
    n = len(labels)
    diffs = []
    for _ in range(draws):
        i = rng.integers(0, n, n)
        if labels[i].min() != labels[i].max():
            diffs.append(roc_auc(labels[i], a[i]) - roc_auc(labels[i], b[i]))
    lo, hi = np.percentile(diffs, [2.5, 97.5]) if diffs else (float("nan"),) * 2
    return roc_auc(labels, a) - roc_auc(labels, b), float(lo), float(hi)


def judge(
    events: list[dict], config: TrainConfig, folds: list[Fold],
    log: Callable[[str], object] = print, trainer: Callable | None = None,
) -> list[FoldResult]:  # fmt: skip
    """Every fold's result (judge_fold), logging a line per fold. Each fold's training run
    holds no test users of its own: the fold's users are its test."""
    config = config.model_copy(update={"test_fraction": 0.0})
    types = vocabulary(events, config)
    shop = shop_sessions(events, config.session_gap_seconds, config.label_type)
    rows = step_features(shop, types)
    out = []
    for fold in folds:
        r = judge_fold(events, shop, rows, fold, config, trainer)
        shown = ", ".join(f"{n} {m['auc_last']:.3f}/{m['auc_all']:.3f}"
                          for n, m in r.metrics.items())  # fmt: skip
        log(f"repeat {fold.repeat} fold {fold.index}: {r.sessions} held-out sessions, "
            f"{r.positive} buying; AUC last/all: {shown} ({r.seconds:.0f} s)")  # fmt: skip
        out.append(r)
    return out


def bootstrap_interval(values: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the mean of `values`, resampled with replacement."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    if len(v) < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (draws, len(v)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def summary(results: list[FoldResult]) -> dict:
    """Per scorer and metric: mean, 95% bootstrap interval over folds, per-fold values; the
    model's paired differences against the better baseline of each metric (AUC: higher is
    better; ECE: lower)."""
    names = list(results[0].metrics)
    out: dict = {"folds": len(results), "scorers": {}, "paired": {}}
    for name in names:
        out["scorers"][name] = {}
        for metric in METRICS:
            v = np.array([r.metrics[name][metric] for r in results])
            out["scorers"][name][metric] = {"mean": float(np.nanmean(v)),
                                            "interval": bootstrap_interval(v),
                                            "folds": v.tolist()}  # fmt: skip
    for metric in METRICS:
        sign = -1.0 if metric.startswith("ece") else 1.0
        means = {n: out["scorers"][n][metric]["mean"] for n in names if n != MODEL}
        best = max(means, key=lambda n: sign * means[n])
        d = np.array([r.metrics[MODEL][metric] - r.metrics[best][metric] for r in results])
        out["paired"][metric] = {"against": best, "mean": float(np.nanmean(d)),
                                 "interval": bootstrap_interval(d),
                                 "ahead": int(np.sum(sign * d > 0)), "of": len(d)}  # fmt: skip
    return out


def calibrated_ece_over(
    results: list[FoldResult], bound: float, draws: int = 200, seed: int = 0
) -> tuple[float, float]:
    """What an ECE bound per fold asks of a perfectly calibrated scorer on these folds: each
    fold's sessions scored at every step with the model's held-out score at their last
    event, their labels drawn from it. Returns (the folds above `bound` on average, the
    chance that none is): the part of the measured ECE that is label noise alone."""
    rng = np.random.default_rng(seed)
    shares = []
    for r in results:
        p = np.clip(r.scores[MODEL].last, 0.0, 1.0)
        steps = np.repeat(p, r.lengths)
        over = sum(
            expected_calibration_error(np.repeat(rng.random(len(p)) < p, r.lengths), steps) > bound
            for _ in range(draws)
        )
        shares.append(over / draws)
    q = np.array(shares)
    return float(q.sum()), float(np.prod(1.0 - q))


def reliability_by_quantile(results: list[FoldResult], name: str = MODEL, bins: int = 10):
    """The scorer's held-out step scores pooled over folds, in `bins` score quantiles: (mean
    score, observed positive rate, steps) per bin."""
    p = np.concatenate([r.scores[name].every for r in results])
    y = np.concatenate([np.repeat(r.labels, r.lengths) for r in results])
    order = np.argsort(p, kind="stable")
    return [(float(p[idx].mean()), float(y[idx].mean()), len(idx))
            for idx in np.array_split(order, bins) if len(idx)]  # fmt: skip
