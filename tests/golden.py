"""The golden e-commerce example (docs/contract.md, The model), as an artifact built by hand."""

from __future__ import annotations

import numpy as np

from model.artifact import FORMAT, Model, ModelMeta, validate_model

GOLDEN_EVENTS = ["view", "add_to_cart", "coupon"]
GOLDEN_SCORES = [0.27727, 0.39708, 0.67314]


def golden_model() -> Model:
    """One layer, H = 2, the seed's matrices, identity head, no session reset."""
    meta = ModelMeta(
        format=FORMAT,
        cell="rnn",
        layers=1,
        hidden=2,
        event_types=GOLDEN_EVENTS,
        features=[],
        head="identity",
        session_gap_seconds=0,
    )
    arrays = {
        # view, add_to_cart, coupon, then the reserved row for unknown types
        "embedding": np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.float64),
        "layer0.W_xh": 0.5 * np.eye(2),
        "layer0.W_hh": 0.8 * np.eye(2),
        "layer0.b_h": np.zeros(2),
        "head.W_hq": np.array([[0.6], [0.4]]),
        "head.b_q": np.zeros(1),
    }
    return validate_model(meta, arrays)
