"""PyTorch weights → artifact arrays, in plain numpy (torch is never imported here).

A model trained in PyTorch as `nn.Embedding(V, D)` → `nn.RNN`, `nn.GRU` or `nn.LSTM` (any
number of layers, `bias=True`, tanh) → `nn.Linear(H, 1)` converts exactly: PyTorch computes
x W^T + b with weights stored (out, in); the artifact stores the transposes (row vectors, as
in the tutorials the model comes from: docs/contract.md, The model). PyTorch's
`weight_ih_l{l}` of a GRU stacks the gates r, z, n in that order:

    W_xr, W_xz, W_xn = weight_ih[:H].T, weight_ih[H:2H].T, weight_ih[2H:].T   (the same for hh)
    b_r = b_ir + b_hr    b_z = b_iz + b_hz    b_xn = b_in    b_hn = b_hn   (inside r ⊙ (...))

An Elman layer: W_xh = weight_ih.T, W_hh = weight_hh.T, b_h = bias_ih + bias_hh. An LSTM
layer (no projection, `proj_size=0`) stacks its gates i, f, g, o in that order:

    W_xi, W_xf, W_xg, W_xo = the four row blocks of weight_ih, transposed (the same for hh)
    b_i = b_ii + b_hi    b_f = b_if + b_hf    b_g = b_ig + b_hg    b_o = b_io + b_ho

    state = {k: v.detach().cpu().numpy() for k, v in module.state_dict().items()}
    arrays = arrays_from_torch(state, cell="gru", layers=1)
    model = validate_model(ModelMeta(format=FORMAT, cell="gru", ...), arrays)

The embedding's last row is the unknown-type row (V = event types + 1), as in the artifact.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def _split_gates(a: np.ndarray, n: int) -> list[np.ndarray]:
    H = a.shape[0] // n
    return [a[g * H : (g + 1) * H] for g in range(n)]


def arrays_from_torch(
    state: Mapping[str, np.ndarray],
    cell: str,
    layers: int,
    embedding: str = "embedding.weight",
    rnn: str = "rnn.",
    head: str = "head.",
) -> dict[str, np.ndarray]:
    """Artifact arrays (float32) from a state_dict given as numpy arrays.

    `embedding` names the embedding weight; `rnn` and `head` are the key prefixes of the
    nn.RNN/nn.GRU/nn.LSTM and of the nn.Linear head.
    """

    def get(key: str) -> np.ndarray:
        if key not in state:
            raise KeyError(f"state_dict has no {key!r} (keys: {sorted(state)})")
        return np.asarray(state[key], np.float64)

    out = {"embedding": get(embedding)}
    for layer in range(layers):
        w_ih, w_hh = get(f"{rnn}weight_ih_l{layer}"), get(f"{rnn}weight_hh_l{layer}")
        b_ih, b_hh = get(f"{rnn}bias_ih_l{layer}"), get(f"{rnn}bias_hh_l{layer}")
        p = f"layer{layer}."
        if cell == "rnn":
            out |= {p + "W_xh": w_ih.T, p + "W_hh": w_hh.T, p + "b_h": b_ih + b_hh}
        elif cell == "gru":
            (xr, xz, xn), (hr, hz, hn) = _split_gates(w_ih, 3), _split_gates(w_hh, 3)
            (bir, biz, bin_), (bhr, bhz, bhn) = _split_gates(b_ih, 3), _split_gates(b_hh, 3)
            out |= {
                p + "W_xr": xr.T, p + "W_xz": xz.T, p + "W_xn": xn.T,
                p + "W_hr": hr.T, p + "W_hz": hz.T, p + "W_hn": hn.T,
                p + "b_r": bir + bhr, p + "b_z": biz + bhz, p + "b_xn": bin_, p + "b_hn": bhn,
            }  # fmt: skip
        elif cell == "lstm":
            if f"{rnn}weight_hr_l{layer}" in state:
                raise ValueError("an nn.LSTM with proj_size > 0 has no artifact form")
            W_x, W_h = _split_gates(w_ih, 4), _split_gates(w_hh, 4)
            b = [i + h for i, h in zip(_split_gates(b_ih, 4), _split_gates(b_hh, 4), strict=True)]
            for gate, wx, wh, bias in zip("ifgo", W_x, W_h, b, strict=True):
                out |= {p + f"W_x{gate}": wx.T, p + f"W_h{gate}": wh.T, p + f"b_{gate}": bias}
        else:
            raise ValueError(f"unknown cell {cell!r}; use rnn, gru or lstm")
    out["head.W_hq"] = get(f"{head}weight").T
    out["head.b_q"] = get(f"{head}bias")
    return {k: np.ascontiguousarray(v, np.float32) for k, v in out.items()}
