"""A seeded model of random weights: where training starts, and what tests and benchmarks
score with."""

from __future__ import annotations

import numpy as np

from model.artifact import (
    CELL_ARRAYS,
    FORMAT,
    FORMAT_2,
    WIDE_HEAD,
    Model,
    ModelMeta,
    expected_shapes,
    layer_array_names,
    statistics_rows,
    table_rows,
    validate_model,
)
from model.inputs import Inputs, without_session_stats


def random_model(
    event_types: list[str],
    hidden: int,
    layers: int = 1,
    features: list[str] | None = None,
    embedding_dim: int | None = None,
    head: str = "sigmoid",
    session_gap_seconds: float = 1800.0,
    seed: int = 0,
    dtype: type = np.float32,
    cell: str = "rnn",
    inputs: Inputs | list | None = None,
    wide_head: bool = False,
) -> Model:
    """A seeded random model: N(0, 1) embedding (and input tables), PyTorch-style
    U(-1/sqrt(H), 1/sqrt(H)) cell and head. Given `inputs` (an Inputs or its JSON list), a
    format 2 model declaring them; with `wide_head`, a head that also reads the numeric
    columns of x."""
    rng = np.random.default_rng(seed)
    meta = ModelMeta(
        format=FORMAT if inputs is None else FORMAT_2,
        inputs=inputs,
        cell=cell,
        layers=layers,
        hidden=hidden,
        event_types=list(event_types),
        features=list(features or []),
        head=head,
        session_gap_seconds=session_gap_seconds,
        wide_head=wide_head,
    )
    D = embedding_dim or min(16, hidden)
    bound = 1.0 / np.sqrt(hidden)
    arrays = {}
    # drawn as for the same model without session statistics, whose rows start at 0: the
    # statistics change nothing else (a run with and without them differs by them alone)
    plain = meta.model_copy(update={"inputs": without_session_stats(meta.declared_inputs)})
    for name, shape in expected_shapes(plain, D).items():
        if name == "embedding" or name.startswith("input."):
            arrays[name] = rng.standard_normal(shape).astype(dtype)
        else:
            arrays[name] = rng.uniform(-bound, bound, shape).astype(dtype)
    arrays = _with_statistics_rows(meta, arrays, D)
    if wide_head:
        arrays[WIDE_HEAD][table_rows(meta)] = 0.0
    return validate_model(meta, arrays)


def _with_statistics_rows(meta: ModelMeta, arrays: dict, D: int) -> dict:
    """Arrays of the model without session statistics with their rows inserted, zero."""
    rows = statistics_rows(meta)
    if not len(rows):
        return arrays
    # each row's place in the array without them: the rows before it that are not statistics
    at = rows - np.arange(len(rows))
    out = dict(arrays)
    for name in layer_array_names(meta.cell, 0)[: len(CELL_ARRAYS[meta.cell]["input"])]:
        out[name] = np.insert(arrays[name], D + at, 0.0, axis=0)
    if WIDE_HEAD in arrays:
        out[WIDE_HEAD] = np.insert(arrays[WIDE_HEAD], at, 0.0, axis=0)
    return out
