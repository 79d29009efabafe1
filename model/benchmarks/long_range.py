"""Synthetic sessions whose decisive evidence sits far from the end, with the exact
Bayes-optimal score of each: the test bed where a gated cell (GRU, LSTM) should beat the Elman
cell.

Each session is one user's: a hidden intent z (P(z) = 1/2) decides the purchase
(P(buy | z) = 0.85, P(buy | not z) = 0.15), and shows only in a few evidence events among
uninformative noise events (view, search, scroll, review):

- `head`: the first three events are wishlist or compare, each a wishlist with probability
  0.75 under z and 0.25 otherwise; then 40-120 noise events. The model must count the
  three and carry the count (not just one bit) to the end.
- `sparse`: 40-120 noise events with 2-4 ordered pairs spread through them: coupon then
  add_to_cart (evidence for z, with probability 0.8 under z) or the reverse order; the
  evidence adds up over the whole session.
- `short`: as `head`, with 0-12 noise events (sessions of 3-15 events).

The label event (`purchase`) closes a buying session, as in the shop data the trainer reads.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Literal

import numpy as np

NOISE = ["view", "search", "scroll", "review"]
HEAD_TYPES = ["wishlist", "compare"]
PAIR = ("coupon", "add_to_cart")  # in this order: evidence for the intent
EVENT_TYPES = [*NOISE, *HEAD_TYPES, *PAIR]
LABEL_TYPE = "purchase"
P_BUY = (0.15, 0.85)  # P(purchase | z = 0), P(purchase | z = 1)
P_WISH = (0.25, 0.75)  # head: P(a head event is a wishlist | z)
P_ORDER = (0.2, 0.8)  # sparse: P(a pair comes in the evidence order | z)

Mode = Literal["head", "sparse", "short"]


def _posterior_buy(likelihood_z1: float, likelihood_z0: float) -> float:
    """P(purchase | evidence), from the evidence's likelihood under each intent."""
    p1 = likelihood_z1 / (likelihood_z1 + likelihood_z0)
    return p1 * P_BUY[1] + (1 - p1) * P_BUY[0]


def _head(rng: np.random.Generator, z: int, body: int) -> tuple[list[str], float]:
    wish = rng.random(3) < P_WISH[z]
    head = [HEAD_TYPES[0] if w else HEAD_TYPES[1] for w in wish]
    noise = [NOISE[i] for i in rng.integers(0, len(NOISE), body)]
    k = int(wish.sum())
    like1 = P_WISH[1] ** k * (1 - P_WISH[1]) ** (3 - k)
    like0 = P_WISH[0] ** k * (1 - P_WISH[0]) ** (3 - k)
    return [*head, *noise], _posterior_buy(like1, like0)


def _sparse(rng: np.random.Generator, z: int, body: int) -> tuple[list[str], float]:
    types = [NOISE[i] for i in rng.integers(0, len(NOISE), body)]
    n_pairs = int(rng.integers(2, 5))
    slots = np.sort(rng.choice(body // 4, n_pairs, replace=False)) * 4  # pairs never overlap
    like1 = like0 = 1.0
    for s in slots:
        forward = rng.random() < P_ORDER[z]
        types[s], types[s + 1 + int(rng.integers(2))] = PAIR if forward else PAIR[::-1]
        like1 *= P_ORDER[1] if forward else 1 - P_ORDER[1]
        like0 *= P_ORDER[0] if forward else 1 - P_ORDER[0]
    return types, _posterior_buy(like1, like0)


def long_range_sessions(
    n_sessions: int, mode: Mode, seed: int = 0
) -> list[tuple[list[str], bool, float]]:
    """Sessions as (event types, bought, Bayes-optimal P(purchase) given the types)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_sessions):
        z = int(rng.random() < 0.5)
        if mode == "short":
            types, p = _head(rng, z, int(rng.integers(0, 13)))
        elif mode == "head":
            types, p = _head(rng, z, int(rng.integers(40, 121)))
        elif mode == "sparse":
            types, p = _sparse(rng, z, int(rng.integers(40, 121)))
        else:
            raise ValueError(f"unknown mode {mode!r}; use head, sparse or short")
        out.append((types, bool(rng.random() < P_BUY[z]), p))
    return out


def long_range_events(
    n_sessions: int, mode: Mode, seed: int = 0, start_ms: int = 1_700_000_000_000
) -> Iterator[dict]:
    """The sessions as events (one user each, 5 s apart), a buying one closed by `purchase`."""
    return _as_events(long_range_sessions(n_sessions, mode, seed), seed, start_ms)


def _as_events(
    sessions: list[tuple[list[str], bool, float]], seed: int, start_ms: int = 1_700_000_000_000
) -> Iterator[dict]:
    for i, (types, bought, _) in enumerate(sessions):
        t0 = start_ms + i * 3_600_000
        names = [*types, LABEL_TYPE] if bought else types
        for k, t in enumerate(names):
            yield {"user_id": f"s{seed}-{i}", "type": t, "ts": t0 + 5_000 * k}


def bayes_auc(sessions: list[tuple[list[str], bool, float]], users: set[str], seed: int) -> float:
    """ROC AUC of the Bayes-optimal score on the sessions of these users (of seed's data)."""
    from model.training.evaluate import roc_auc

    picked = [(b, p) for i, (_, b, p) in enumerate(sessions) if f"s{seed}-{i}" in users]
    return roc_auc(np.array([b for b, _ in picked]), np.array([p for _, p in picked]))


CELLS = ("rnn", "gru", "lstm")


def compare_cells(
    mode: Mode,
    n_sessions: int = 6000,
    hidden: int = 16,
    epochs: int = 10,
    seed: int = 1,
    cells: tuple[str, ...] = CELLS,
) -> dict[str, float]:
    """Validation AUC (last step) of each cell (Elman, GRU, LSTM) and of the Bayes-optimal
    score. The cells train on the same sessions, prepared once."""
    from model.training.config import TrainConfig  # as roc_auc above
    from model.training.prepare import prepare_training
    from model.training.train import train

    config = TrainConfig(
        hidden=hidden, epochs=epochs, features=[], embedding_dim=8, seed=0,
        event_types=[*EVENT_TYPES, LABEL_TYPE], patience=epochs,
        test_fraction=0.0,  # judged on the validation users, beside their Bayes score
        calibrate=False,  # the AUC compared is the raw scores' (a calibration map keeps it)
    )  # fmt: skip
    sessions = long_range_sessions(n_sessions, mode, seed)
    data = prepare_training(_as_events(sessions, seed), config)
    out = {}
    for cell in cells:
        result = train(data, config.model_copy(update={"cell": cell}))
        out[cell] = result.report["metrics"]["auc_last"]
    users = {s.user_id for s in data.valid_s}
    out["bayes"] = bayes_auc(sessions, users, seed)
    return out


def main(argv: list[str] | None = None) -> None:
    """Print the comparison table for the three modes."""
    p = argparse.ArgumentParser(
        prog="python -m model.benchmarks.long_range", description=__doc__.split("\n")[0]
    )
    p.add_argument("--sessions", type=int, default=6000)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--cells", nargs="+", choices=CELLS, default=list(CELLS))
    args = p.parse_args(argv)
    print(f"{args.sessions} sessions, H = {args.hidden}, {args.epochs} epochs (best kept); "
          "validation AUC at the last step")  # fmt: skip
    names = {"rnn": "Elman", "gru": "GRU", "lstm": "LSTM"}
    cells = args.cells
    print(f"{'mode':<8} {'Bayes':>7} " + " ".join(f"{names[c]:>7}" for c in cells) + " "
          + " ".join(f"{names[c] + '/Bayes':>11}" for c in cells))  # fmt: skip
    for mode in ("head", "sparse", "short"):
        r = compare_cells(mode, args.sessions, args.hidden, args.epochs, args.seed, tuple(cells))
        print(f"{mode:<8} {r['bayes']:>7.3f} " + " ".join(f"{r[c]:>7.3f}" for c in cells) + " "
              + " ".join(f"{r[c] / r['bayes']:>11.3f}" for c in cells), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
