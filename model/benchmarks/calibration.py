"""Do scores keep their meaning across training runs? Models trained with different settings
on the posterior shop (model/data/posterior.py), judged on users none of them saw against the
exact posterior: calibration error, the share of sessions above thresholds, and the distance
to the true probability.

    python -m model.benchmarks.calibration [--users 5000] [--test-users 4000]
    python -m model.benchmarks.calibration --cost      # what applying the map costs per event
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from model.artifact import Model
from model.calibration import brier_score, expected_calibration_error
from model.data.posterior import LABEL, posterior_shop
from model.scoring import InMemoryScorer, ScoringModel
from model.training.config import TrainConfig
from model.training.evaluate import roc_auc
from model.training.train import train

SETTINGS = {
    "defaults": {},
    "--epochs 3": {"epochs": 3},
    "--cell gru": {"cell": "gru"},
    "--cell lstm": {"cell": "lstm"},
    "--seed 7 --lr 0.02": {"seed": 7, "lr": 0.02},
}
THRESHOLDS = (0.4, 0.6)


@dataclass(frozen=True)
class Steps:
    """Every input event of the test sessions: score, exact posterior, session label, and
    whether it is its session's last input."""

    score: np.ndarray
    posterior: np.ndarray
    label: np.ndarray
    last: np.ndarray


def scored_steps(model: Model | None, events: list[dict], posterior: dict, gap_ms: float,
               raw: bool = False) -> Steps:  # fmt: skip
    """The test events scored in stream order as the worker would (model None: the exact
    posterior as the score), cut into sessions as training cuts them."""
    if model is not None:
        scorer = InMemoryScorer(ScoringModel(model, raw=raw))
        scores = scorer.score([e["user_id"] for e in events], [e["type"] for e in events],
                              np.array([e["ts"] for e in events], np.int64))  # fmt: skip
    else:
        scores = np.array([posterior.get((e["user_id"], e["ts"]), np.nan) for e in events])
    by_user: dict[str, list] = defaultdict(list)
    for e, s in zip(events, scores.tolist(), strict=True):
        by_user[e["user_id"]].append((e, s))
    rows: list[tuple] = []
    for evs in by_user.values():
        session: list = []
        for e, s in evs:
            if session and e["ts"] - session[-1][0]["ts"] > gap_ms:
                rows += _session_rows(session, posterior)
                session = []
            session.append((e, s))
        rows += _session_rows(session, posterior)
    a = np.array(rows, np.float64).reshape(-1, 4)
    return Steps(a[:, 0], a[:, 1], a[:, 2], a[:, 3] == 1)


def _session_rows(session: list, posterior: dict) -> list[tuple]:
    """(score, posterior, label, last) of a session's inputs: the events before its first
    purchase, labelled by whether there is one."""
    inputs = []
    for e, s in session:
        if e["type"] == LABEL:
            break
        inputs.append((e, s))
    label = float(len(inputs) < len(session))
    return [
        (s, posterior[(e["user_id"], e["ts"])], label, float(k == len(inputs) - 1))
        for k, (e, s) in enumerate(inputs)
    ]


def figures(steps: Steps) -> dict[str, float]:
    """AUC, ECE, Brier (last input and every step), shares above thresholds, mean |score -
    posterior|."""
    last = steps.last
    out = {
        "auc_last": roc_auc(steps.label[last], steps.score[last]),
        "ece_last": expected_calibration_error(steps.label[last], steps.score[last]),
        "ece_all": expected_calibration_error(steps.label, steps.score),
        "brier_last": brier_score(steps.label[last], steps.score[last]),
        "mae_posterior": float(np.mean(np.abs(steps.score - steps.posterior))),
    }
    for t in THRESHOLDS:
        out[f"share_{t:g}"] = float(np.mean(steps.score[last] >= t))
    return out


def run(users: int, test_users: int, seed: int = 1) -> dict[str, dict[str, float]]:
    """Each setting's figures (raw and calibrated) and the exact posterior's, on one test
    set."""
    events, _ = posterior_shop(users, seed=seed)
    test, posterior = posterior_shop(test_users, seed=seed + 1000)
    gap_ms = TrainConfig().session_gap_seconds * 1000
    table = {"true posterior": figures(scored_steps(None, test, posterior, gap_ms))}
    for name, overrides in SETTINGS.items():
        # its test users are generated apart: training needs none of its own
        model = train(events, TrainConfig(**({"test_fraction": 0.0} | overrides))).model
        table[f"{name}, raw"] = figures(scored_steps(model, test, posterior, gap_ms, raw=True))
        table[name] = figures(scored_steps(model, test, posterior, gap_ms))
    return table


def cost_per_event(batch: int = 512, hidden: int = 64, rounds: int = 41) -> dict[str, float]:
    """Median ns per event of ScoringModel.advance over one batch, without and with a
    128-knot calibration map (rounds alternated, the same states and events)."""
    from model.artifact import validate_model
    from model.calibration import Calibration
    from model.random_init import random_model

    types = ["view", "search", "add_to_cart", "coupon", "checkout"]
    plain = random_model(types, hidden=hidden, features=["gap"], seed=1)
    knots = np.linspace(0.01, 0.99, 128)
    cal = Calibration(x=knots.tolist(), y=(knots**1.5).tolist())
    meta = plain.meta.model_validate(plain.meta.model_dump() | {"calibration": cal.model_dump()})
    models = {"raw head": ScoringModel(plain),
              "calibrated": ScoringModel(validate_model(meta, plain.arrays))}  # fmt: skip
    rng = np.random.default_rng(0)
    slot = rng.integers(0, batch // 2, batch)
    type_idx = rng.integers(0, len(types), batch)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(1000, 60_000, batch))
    times: dict[str, list[float]] = {name: [] for name in models}
    for m in models.values():
        m.warm_up()
    for _ in range(rounds):
        for name, m in models.items():
            state = np.zeros((batch // 2, *m.state_shape), np.float32)
            last = np.full(batch // 2, -1, np.int64)
            t0 = time.perf_counter()
            for _ in range(20):
                m.advance(state, last.copy(), slot, type_idx, ts)
            times[name].append((time.perf_counter() - t0) / (20 * batch) * 1e9)
    out = {name: float(np.median(t)) for name, t in times.items()}
    out["ratio"] = out["calibrated"] / out["raw head"]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=5000, help="training users")
    parser.add_argument("--test-users", type=int, default=4000, help="held-out test users")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cost", action="store_true", help="measure the map's cost instead")
    args = parser.parse_args(argv)
    if args.cost:
        cost = cost_per_event()
        print(f"ScoringModel.advance, 512-event batch, H = 64, ns/event (median of 41 rounds): "
              f"raw head {cost['raw head']:.0f}, calibrated {cost['calibrated']:.0f}, "
              f"ratio {cost['ratio']:.3f}")  # fmt: skip
        return
    table = run(args.users, args.test_users, args.seed)
    keys = ["auc_last", "ece_last", "ece_all", "brier_last", "mae_posterior",
            *(f"share_{t:g}" for t in THRESHOLDS)]  # fmt: skip
    print("| model | " + " | ".join(keys) + " |")
    print("| --- " * (len(keys) + 1) + "|")
    for name, f in table.items():
        print(f"| {name} | " + " | ".join(f"{f[k]:.3f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
