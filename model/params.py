"""The one packed layout of a model's parameters, shared by the scoring kernels and training.

A layer's gates sit side by side in columns, in PyTorch's order: an Elman layer has one group
(G = 1), a GRU layer three (r, z, n: G = 3), an LSTM layer four (i, f, g, o: G = 4). So a
wave's input term and its recurrent term are one matrix product each per layer, whatever the
cell.

    E     (V, D)            embedding; the last row is for unknown types
    W_x0  (D+F, G·H)        layer 0's input weights: embedding rows, then feature rows
    W_h0  (H, G·H)          layer 0's recurrent weights
    W_up  (L-1, 2H, G·H)    layers 1..L-1: input rows [:H] (the layer below), recurrent rows [H:]
    b_x   (L, G·H)          input-side biases: b_h (rnn); b_r, b_z, b_xn (gru); b_i, b_f, b_g,
                            b_o (lstm)
    b_hn  (L, H)            GRU's recurrent bias of n, inside r ⊙ (h W_hn + b_hn); 0 otherwise
    w_q   (H,), b_q (1,)    the head
    w_f   (F + inputs,)     the wide part of the head (meta.wide_head): weights of layer 0's
                            input columns after the embedding's, 0 on input-table columns;
                            (0,) for a model without one
    tab   (sum buckets·dim,) the declared inputs' embedding tables (model/inputs.py), flat, in
                            declaration order; table k's row b is
                            tab[off + b·dim : off + (b+1)·dim] with (off, dim, col) = tab_at[k],
                            col its first column in layer 0's input x (not a parameter)

Stacking a layer's input and recurrent rows lets the Elman kernel take both terms of an upper
layer in one product of [h below | h previous]. `pack` builds it once from the artifact's
arrays; `unpack` names it back (parameters or gradients).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from model.artifact import CELL_ARRAYS, WIDE_HEAD
from model.inputs import Inputs, InputSpec, input_width, spec_width, table_name

CELL_RNN = 0
CELL_GRU = 1
CELL_LSTM = 2
CELL_CODES = {"rnn": CELL_RNN, "gru": CELL_GRU, "lstm": CELL_LSTM}
CELL_NAMES = {code: name for name, code in CELL_CODES.items()}
GATES = {"rnn": 1, "gru": 3, "lstm": 4}


class Params(NamedTuple):
    """A model's parameters in the packed layout (all one dtype, C-contiguous)."""

    cell: int  # CELL_RNN, CELL_GRU or CELL_LSTM
    E: np.ndarray
    W_x0: np.ndarray
    W_h0: np.ndarray
    W_up: np.ndarray
    b_x: np.ndarray
    b_hn: np.ndarray
    w_q: np.ndarray
    b_q: np.ndarray
    w_f: np.ndarray
    tab: np.ndarray
    tab_at: np.ndarray  # (K, 3) int64: offset, dim, column of each table; not a parameter

    @property
    def cell_name(self) -> str:
        return CELL_NAMES[self.cell]

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by field name (for optimisers and clipping; updates write through)."""
        return {k: v for k, v in self._asdict().items() if k not in ("cell", "tab_at")}

    def zeros_like(self) -> Params:
        """Zero arrays of the same layout: a gradient accumulator."""
        return self._with(np.zeros_like(a) for a in self.arrays().values())

    def astype(self, dtype: type) -> Params:
        """The arrays in another dtype (the same arrays when they already have it)."""
        return self._with(np.ascontiguousarray(a, dtype) for a in self.arrays().values())

    def copy(self) -> Params:
        """A deep copy."""
        return self._with(a.copy() for a in self.arrays().values())

    def _with(self, arrays) -> Params:
        return Params(self.cell, *arrays, self.tab_at)


def _gates(arrays: dict[str, np.ndarray], cell: str, layer: int, kind: str) -> np.ndarray:
    """One layer's input or recurrent weights of every gate side by side: (rows, G·H)."""
    names = CELL_ARRAYS[cell][kind]
    return np.concatenate([arrays[f"layer{layer}.{n}"] for n in names], axis=1)


def _input_bias(arrays: dict[str, np.ndarray], cell: str, layer: int) -> np.ndarray:
    names = CELL_ARRAYS[cell]["bias"][: GATES[cell]]  # b_hn (gru) is kept apart
    return np.concatenate([arrays[f"layer{layer}.{n}"] for n in names])


def table_layout(inputs: Inputs | Sequence[InputSpec] | None, x_offset: int) -> np.ndarray:
    """(K, 3) int64: each embedding table's (offset in the flat `tab`, dim, first column in
    x), in declaration order; x_offset is where the inputs' block starts in x (D + F)."""
    rows, off, col = [], 0, x_offset
    for spec in inputs or []:
        if spec.kind != "numeric":
            rows.append((off, spec.dim, col))
            off += spec.buckets * spec.dim
        col += spec_width(spec)
    return np.array(rows, np.int64).reshape(len(rows), 3)


def pack(
    arrays: dict[str, np.ndarray],
    cell: str,
    dtype: type = np.float32,
    inputs: Inputs | Sequence[InputSpec] | None = None,
) -> Params:
    """The packed layout of a model given by the artifact's arrays; with `inputs` (the
    model's declared inputs) their embedding tables too, else none (as the scoring kernels,
    which get the inputs' block already gathered)."""
    first_bias = CELL_ARRAYS[cell]["bias"][0]
    L = sum(1 for k in arrays if k.startswith("layer") and k.endswith(f".{first_bias}"))
    H = arrays["head.W_hq"].shape[0]
    G = GATES[cell]
    W_up = np.zeros((L - 1, 2 * H, G * H), dtype)
    for layer in range(1, L):
        W_up[layer - 1, :H] = _gates(arrays, cell, layer, "input")
        W_up[layer - 1, H:] = _gates(arrays, cell, layer, "recurrent")
    b_hn = np.zeros((L, H), dtype)
    if cell == "gru":
        b_hn[:] = [arrays[f"layer{layer}.b_hn"] for layer in range(L)]
    c = np.ascontiguousarray
    return Params(
        cell=CELL_CODES[cell],
        E=c(arrays["embedding"], dtype),
        W_x0=c(_gates(arrays, cell, 0, "input"), dtype),
        W_h0=c(_gates(arrays, cell, 0, "recurrent"), dtype),
        W_up=W_up,
        b_x=c(np.stack([_input_bias(arrays, cell, layer) for layer in range(L)]), dtype),
        b_hn=b_hn,
        w_q=c(arrays["head.W_hq"][:, 0], dtype),
        b_q=c(arrays["head.b_q"], dtype),
        w_f=c(arrays[WIDE_HEAD][:, 0] if WIDE_HEAD in arrays else np.zeros(0), dtype),
        tab=np.concatenate(
            [np.zeros(0, dtype)]
            + [c(arrays[table_name(s)], dtype).ravel() for s in inputs or [] if s.kind != "numeric"]
        ),
        tab_at=table_layout(
            inputs, arrays["embedding"].shape[1] + _n_features(arrays, cell, inputs)
        ),
    )


def _n_features(arrays: dict[str, np.ndarray], cell: str, inputs) -> int:
    """F: layer 0's input rows less the embedding's and the inputs' columns."""
    rows = arrays[f"layer0.{CELL_ARRAYS[cell]['input'][0]}"].shape[0]
    return rows - arrays["embedding"].shape[1] - input_width(inputs or [])


def _split(block: np.ndarray, names: tuple[str, ...], layer: int) -> dict[str, np.ndarray]:
    H = block.shape[-1] // len(names)
    return {f"layer{layer}.{n}": block[..., g * H : (g + 1) * H] for g, n in enumerate(names)}


def unpack(p: Params, inputs: Inputs | Sequence[InputSpec] | None = None) -> dict[str, np.ndarray]:
    """The artifact's arrays (views into p) of a packed model or gradient; the input tables
    by their names when given the `inputs` it was packed with."""
    cell = p.cell_name
    kinds = CELL_ARRAYS[cell]
    L, H = p.b_hn.shape
    out = {"embedding": p.E}
    for layer in range(L):
        W_x = p.W_x0 if layer == 0 else p.W_up[layer - 1, :H]
        W_h = p.W_h0 if layer == 0 else p.W_up[layer - 1, H:]
        out |= _split(W_x, kinds["input"], layer)
        out |= _split(W_h, kinds["recurrent"], layer)
        out |= _split(p.b_x[layer], kinds["bias"][: GATES[cell]], layer)
        if cell == "gru":
            out[f"layer{layer}.b_hn"] = p.b_hn[layer]
    out["head.W_hq"] = p.w_q[:, None]
    out["head.b_q"] = p.b_q
    if p.w_f.shape[0]:
        out[WIDE_HEAD] = p.w_f[:, None]
    tables = [s for s in inputs or [] if s.kind != "numeric"]
    if len(tables) != p.tab_at.shape[0]:
        raise ValueError(f"{p.tab_at.shape[0]} packed input tables, {len(tables)} declared")
    for spec, (off, dim, _) in zip(tables, p.tab_at, strict=True):
        out[table_name(spec)] = p.tab[off : off + spec.buckets * dim].reshape(spec.buckets, dim)
    return out
