"""The baselines a data scientist fits in an afternoon, on session features
(model/judging/session_features.py): logistic regression (its L2 strength chosen by 3-fold
cross-validation on the training sessions) and gradient boosting, both scikit-learn's, each
fitted once on the training sessions' last steps (to score a session at its last event) and
once on every step (to score every prefix)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

LOGISTIC, BOOSTED = "logistic regression", "gradient boosting"
LOGISTIC_C = (0.01, 0.03, 0.1, 0.3, 1.0)  # inverse L2 strengths tried
# Shallow, slow and regularised: a few hundred buying sessions overfit anything deeper.
BOOSTED_PARAMS = {"max_iter": 200, "learning_rate": 0.05, "max_leaf_nodes": 15,
                  "min_samples_leaf": 20, "l2_regularization": 1.0,
                  "early_stopping": False}  # fmt: skip


class MissingLibraryError(RuntimeError):
    """scikit-learn is not installed."""


def _sklearn():
    try:
        from sklearn.ensemble import HistGradientBoostingClassifier
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import cross_val_score
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ImportError:  # pragma: no cover - the train extra installs it
        raise MissingLibraryError(
            "the baselines need scikit-learn: pip install -e '.[train]'"
        ) from None
    return (HistGradientBoostingClassifier, LogisticRegression, cross_val_score, make_pipeline,
            StandardScaler)  # fmt: skip


def fitted(kind: str, X: np.ndarray, y: np.ndarray, seed: int = 0):
    """A baseline of `kind` (LOGISTIC or BOOSTED) fitted on rows X and labels y."""
    Boosted, Logistic, cross_val_score, make_pipeline, Scaler = _sklearn()
    if kind != LOGISTIC:
        return Boosted(random_state=seed, **BOOSTED_PARAMS).fit(X, y)

    def logistic(C: float):
        return make_pipeline(Scaler(), Logistic(C=C, max_iter=2000))

    # the L2 strength with the best log loss in 3-fold cross-validation on these rows
    loss = {C: -cross_val_score(logistic(C), X, y, cv=3, scoring="neg_log_loss").mean()
            for C in LOGISTIC_C}  # fmt: skip
    return logistic(min(loss, key=loss.get)).fit(X, y)


@dataclass(frozen=True)
class StepScores:
    """A scorer's held-out scores: every step (steps concatenated session after session)
    and each session's last step (a baseline: fitted on every step, and on last steps)."""

    every: np.ndarray
    last: np.ndarray


def baseline_scores(
    kind: str, train_rows: list[np.ndarray], train_y: np.ndarray,
    test_rows: list[np.ndarray], seed: int = 0,
) -> StepScores:  # fmt: skip
    """Fit a baseline of `kind` on the training sessions' rows (per session, per step) and
    score the test sessions' rows."""
    last_X = np.stack([r[-1] for r in train_rows])
    every_X = np.concatenate(train_rows)
    every_y = np.repeat(train_y, [len(r) for r in train_rows])
    test_last = np.stack([r[-1] for r in test_rows])
    # One BLAS and OpenMP thread, as training's own loop: on a shop's few thousand sessions
    # the threads' hand-offs cost more than they share (both baselines on REES46-sized rows,
    # 2-core EPYC at load 5.5: 2.4-2.7 s against 16-29 s with the libraries' defaults).
    with threadpool_limits(limits=1):
        at_last = fitted(kind, last_X, train_y, seed)
        at_every = fitted(kind, every_X, every_y, seed)
        return StepScores(
            at_every.predict_proba(np.concatenate(test_rows))[:, 1],
            at_last.predict_proba(test_last)[:, 1],
        )
