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

Stacking a layer's input and recurrent rows lets the Elman kernel take both terms of an upper
layer in one product of [h below | h previous]. `pack` builds it once from the artifact's
arrays; `unpack` names it back (parameters or gradients).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from model.artifact import CELL_ARRAYS

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

    @property
    def cell_name(self) -> str:
        return CELL_NAMES[self.cell]

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays by field name (for optimisers and clipping; updates write through)."""
        return {k: v for k, v in self._asdict().items() if k != "cell"}

    def zeros_like(self) -> Params:
        """Zero arrays of the same layout: a gradient accumulator."""
        return Params(self.cell, *(np.zeros_like(a) for a in self.arrays().values()))

    def astype(self, dtype: type) -> Params:
        """The arrays in another dtype (the same arrays when they already have it)."""
        return Params(self.cell, *(np.ascontiguousarray(a, dtype) for a in self.arrays().values()))

    def copy(self) -> Params:
        """A deep copy."""
        return Params(self.cell, *(a.copy() for a in self.arrays().values()))


def _gates(arrays: dict[str, np.ndarray], cell: str, layer: int, kind: str) -> np.ndarray:
    """One layer's input or recurrent weights of every gate side by side: (rows, G·H)."""
    names = CELL_ARRAYS[cell][kind]
    return np.concatenate([arrays[f"layer{layer}.{n}"] for n in names], axis=1)


def _input_bias(arrays: dict[str, np.ndarray], cell: str, layer: int) -> np.ndarray:
    names = CELL_ARRAYS[cell]["bias"][: GATES[cell]]  # b_hn (gru) is kept apart
    return np.concatenate([arrays[f"layer{layer}.{n}"] for n in names])


def pack(arrays: dict[str, np.ndarray], cell: str, dtype: type = np.float32) -> Params:
    """The packed layout of a model given by the artifact's arrays."""
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
    )


def _split(block: np.ndarray, names: tuple[str, ...], layer: int) -> dict[str, np.ndarray]:
    H = block.shape[-1] // len(names)
    return {f"layer{layer}.{n}": block[..., g * H : (g + 1) * H] for g, n in enumerate(names)}


def unpack(p: Params) -> dict[str, np.ndarray]:
    """The artifact's arrays (views into p) of a packed model or gradient."""
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
    return out
