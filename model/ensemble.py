"""Seed ensembles folded into one model (`train --ensemble K`).

K recurrent models of one architecture, trained from different initialisations on the same
users, average away much of what one run owes to its seed (on REES46's held-out users the
AUC over all steps of single runs spread over 0.629-0.661; three averaged, 0.665). Their
average is itself one recurrent model, so every scoring path, the artifact format and the
worker stay as they are: the members side by side, each reading only its own units.

    embedding, tables    [E_1 | ... | E_K]          (their rows side by side: K·D, K·dim)
    input weights        block k: member k's rows for its own embedding and table columns,
                         its rows for the shared columns (features, values, flags)
    recurrent weights    block diagonal, each member's units read only their own
    head                 W_hq = [W_hq_1; ...; W_hq_K] / K, b_q and W_fq the members' mean

so the folded model's logit is the mean of the members' logits, event by event. The cost is
K times the state and the cell's work.
"""

from __future__ import annotations

import numpy as np

from model.artifact import CELL_ARRAYS, WIDE_HEAD, Model, ModelMeta, validate_model
from model.inputs import Inputs, spec_width


def folded(members: list[Model]) -> Model:
    """One model whose logit is the mean of the members' (same meta but for their weights)."""
    first = members[0]
    meta = first.meta
    if any(m.meta.model_dump() != meta.model_dump() for m in members[1:]):
        raise ValueError("the members of an ensemble must share their architecture and inputs")
    K = len(members)
    wide = _widened_meta(meta, K)
    arrays: dict[str, np.ndarray] = {
        "embedding": np.concatenate([m.arrays["embedding"] for m in members], axis=1)
    }
    for spec in meta.declared_inputs:
        if spec.kind != "numeric":
            name = f"input.{spec.name}.embedding"
            arrays[name] = np.concatenate([m.arrays[name] for m in members], axis=1)
    D = first.arrays["embedding"].shape[1]
    kinds = CELL_ARRAYS[meta.cell]
    for layer in range(meta.layers):
        for name in kinds["input"]:
            key = f"layer{layer}.{name}"
            parts = [m.arrays[key] for m in members]
            arrays[key] = (_first_layer_inputs(parts, meta, D) if layer == 0
                           else _block_diagonal(parts))  # fmt: skip
        for name in kinds["recurrent"]:
            key = f"layer{layer}.{name}"
            arrays[key] = _block_diagonal([m.arrays[key] for m in members])
        for name in kinds["bias"]:
            key = f"layer{layer}.{name}"
            arrays[key] = np.concatenate([m.arrays[key] for m in members])
    arrays["head.W_hq"] = np.concatenate([m.arrays["head.W_hq"] for m in members]) / K
    arrays["head.b_q"] = np.mean([m.arrays["head.b_q"] for m in members], axis=0)
    if meta.wide_head:
        arrays[WIDE_HEAD] = _wide_part([m.arrays[WIDE_HEAD] for m in members], meta, D)
    dtype = first.arrays["head.W_hq"].dtype
    return validate_model(wide, {k: v.astype(dtype) for k, v in arrays.items()})


def _widened_meta(meta: ModelMeta, K: int) -> ModelMeta:
    """The meta of K members side by side: K times the units and the tables' dimensions."""
    inputs = None
    if meta.inputs is not None:
        inputs = Inputs([s if s.kind == "numeric" else s.model_copy(update={"dim": K * s.dim})
                         for s in meta.inputs])  # fmt: skip
    return meta.model_copy(update={"hidden": K * meta.hidden, "inputs": inputs})


def _block_diagonal(parts: list[np.ndarray]) -> np.ndarray:
    """The parts (rows x cols each) on the diagonal of one matrix, zeros elsewhere."""
    rows, cols = parts[0].shape
    out = np.zeros((len(parts) * rows, len(parts) * cols), parts[0].dtype)
    for k, p in enumerate(parts):
        out[k * rows : (k + 1) * rows, k * cols : (k + 1) * cols] = p
    return out


def _row_map(meta: ModelMeta, K: int, D: int) -> list[tuple[int, int]]:
    """For each row of the folded layer 0's input weights: (the member whose row it is, or -1
    for a column all members read; that row in a member's weights)."""
    rows = [(k, j) for k in range(K) for j in range(D)]
    at = D
    rows += [(-1, at + j) for j in range(len(meta.features))]
    at += len(meta.features)
    for spec in meta.declared_inputs:
        table = 0 if spec.kind == "numeric" else spec.dim
        rows += [(k, at + j) for k in range(K) for j in range(table)]
        rows += [(-1, at + j) for j in range(table, spec_width(spec))]
        at += spec_width(spec)
    return rows


def _first_layer_inputs(parts: list[np.ndarray], meta: ModelMeta, D: int) -> np.ndarray:
    """Layer 0's input weights (K·D + F + X', K·H): each member's embedding and table rows
    in its own sub-block, the shared columns' rows side by side."""
    K, H = len(parts), parts[0].shape[1]
    rows = _row_map(meta, K, D)
    out = np.zeros((len(rows), K * H), parts[0].dtype)
    for r, (k, j) in enumerate(rows):
        for m in range(K) if k < 0 else (k,):
            out[r, m * H : (m + 1) * H] = parts[m][j]
    return out


def _wide_part(parts: list[np.ndarray], meta: ModelMeta, D: int) -> np.ndarray:
    """head.W_fq (F + X', 1): the members' mean on the shared columns, 0 on the tables'."""
    rows = _row_map(meta, len(parts), D)[len(parts) * D :]
    out = np.zeros((len(rows), 1), parts[0].dtype)
    for r, (k, j) in enumerate(rows):
        if k < 0:
            out[r] = np.mean([p[j - D] for p in parts], axis=0)
    return out
