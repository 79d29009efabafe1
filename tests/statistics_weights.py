"""Test models whose session-statistics rows move their scores: random_model starts those rows
at 0 (model/artifact.py), where a path that mislaid the statistics would still agree."""

from __future__ import annotations

import numpy as np

from model.artifact import WIDE_HEAD, Model, layer_array_names, statistics_rows, validate_model


def with_statistics_weights(model: Model, seed: int = 0) -> Model:
    """The model with random weights on its session-statistics rows: layer 0's input
    weights and, with a wide head, head.W_fq."""
    rows = statistics_rows(model.meta)
    rng = np.random.default_rng(seed)
    arrays = dict(model.arrays)
    D = arrays["embedding"].shape[1]
    for name in layer_array_names(model.meta.cell, 0):
        if name.split(".")[1].startswith("W_x"):
            a = arrays[name].copy()
            a[D + rows] = rng.uniform(-0.5, 0.5, (len(rows), a.shape[1]))
            arrays[name] = a
    if WIDE_HEAD in arrays:
        a = arrays[WIDE_HEAD].copy()
        a[rows] = rng.uniform(-0.5, 0.5, (len(rows), 1))
        arrays[WIDE_HEAD] = a
    return validate_model(model.meta, arrays)
