"""Plain-numpy float64 reference of the model's math (docs/contract.md, The model), one
event at a time.

Written to be read beside that section, not to be fast, and reading the artifact's arrays by name
(not the packed layout the kernels share), so a packing mistake cannot hide in both. Tests
cross-check every other path against it; the kernel benchmark uses it as its baseline.
"""

from __future__ import annotations

import numpy as np

from model.artifact import WIDE_HEAD, cell_of


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def rnn_layer(a: dict[str, np.ndarray], layer: int, x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Elman: h' = tanh(x W_xh + h W_hh + b_h)."""
    w = _float64_getter(a, layer)
    return np.tanh(x @ w("W_xh") + h @ w("W_hh") + w("b_h"))


def gru_layer(a: dict[str, np.ndarray], layer: int, x: np.ndarray, h: np.ndarray) -> np.ndarray:
    """PyTorch nn.GRU in row vectors: r, z gates; n = tanh(x W_xn + b_xn + r ⊙ (h W_hn + b_hn))."""
    w = _float64_getter(a, layer)
    r = _sigmoid(x @ w("W_xr") + h @ w("W_hr") + w("b_r"))
    z = _sigmoid(x @ w("W_xz") + h @ w("W_hz") + w("b_z"))
    n = np.tanh(x @ w("W_xn") + w("b_xn") + r * (h @ w("W_hn") + w("b_hn")))
    return (1.0 - z) * n + z * h


def lstm_layer(
    a: dict[str, np.ndarray], layer: int, x: np.ndarray, state: np.ndarray
) -> np.ndarray:
    """PyTorch nn.LSTM in row vectors; the layer's state is [h, c] (2H): returns [h', c'].

    i = sigmoid(x W_xi + h W_hi + b_i)    f = sigmoid(x W_xf + h W_hf + b_f)
    g = tanh(x W_xg + h W_hg + b_g)       o = sigmoid(x W_xo + h W_ho + b_o)
    c' = f ⊙ c + i ⊙ g                    h' = o ⊙ tanh(c')
    """
    w = _float64_getter(a, layer)
    H = state.shape[0] // 2
    h, c = state[:H], state[H:]
    i = _sigmoid(x @ w("W_xi") + h @ w("W_hi") + w("b_i"))
    f = _sigmoid(x @ w("W_xf") + h @ w("W_hf") + w("b_f"))
    g = np.tanh(x @ w("W_xg") + h @ w("W_hg") + w("b_g"))
    o = _sigmoid(x @ w("W_xo") + h @ w("W_ho") + w("b_o"))
    c_new = f * c + i * g
    return np.concatenate([o * np.tanh(c_new), c_new])


def _float64_getter(a: dict[str, np.ndarray], layer: int):
    return lambda name: np.asarray(a[f"layer{layer}.{name}"], np.float64)


LAYERS = {"rnn": rnn_layer, "gru": gru_layer, "lstm": lstm_layer}


def reference_step(
    params: dict[str, np.ndarray],
    h: np.ndarray,
    type_idx: int,
    features: np.ndarray,
    head: str,
    cell: str | None = None,
) -> tuple[np.ndarray, float]:
    """Return (new state, score) after one event, given the artifact's arrays by name.

    The state is one user's: (L, H), or (L, 2H) for an LSTM (each layer's h, then its c), as
    the kernels keep it. `cell` ("rnn", "gru" or "lstm") defaults to the one the array names
    show. A layer's output, the next layer's input and the head's, is its h.
    """
    layer_fn = LAYERS[cell or cell_of(params)]
    x = np.concatenate([params["embedding"][type_idx], features]).astype(np.float64)
    H = params["head.W_hq"].shape[0]
    h_new = np.empty(h.shape, np.float64)
    below = x
    for layer in range(h.shape[0]):
        h_new[layer] = layer_fn(params, layer, below, np.asarray(h[layer], np.float64))
        below = h_new[layer, :H]
    z = float(below @ params["head.W_hq"][:, 0] + params["head.b_q"][0])
    if WIDE_HEAD in params:  # the wide part: the numeric columns of x straight to the logit
        z += float(x[params["embedding"].shape[1] :] @ params[WIDE_HEAD][:, 0])
    score = 1.0 / (1.0 + np.exp(-z)) if head == "sigmoid" else z
    return h_new, score
