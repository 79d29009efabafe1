"""Plain-numpy float64 reference of the model's math (docs/contract.md, The model), one
event at a time.

Written to be read beside that section, not to be fast, and reading the artifact's arrays by name
(not the packed layout the kernels share), so a packing mistake cannot hide in both. Tests
cross-check every other path against it; the kernel benchmark uses it as its baseline.
"""

from __future__ import annotations

import numpy as np

from model.artifact import cell_of


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


def _float64_getter(a: dict[str, np.ndarray], layer: int):
    return lambda name: np.asarray(a[f"layer{layer}.{name}"], np.float64)


LAYERS = {"rnn": rnn_layer, "gru": gru_layer}


def reference_step(
    params: dict[str, np.ndarray],
    h: np.ndarray,
    type_idx: int,
    features: np.ndarray,
    head: str,
    cell: str | None = None,
) -> tuple[np.ndarray, float]:
    """Return (new h (L, H), score) after one event, given the artifact's arrays by name.

    `cell` ("rnn" or "gru") defaults to the one the array names show.
    """
    layer_fn = LAYERS[cell or cell_of(params)]
    x = np.concatenate([params["embedding"][type_idx], features]).astype(np.float64)
    h_new = np.empty(h.shape, np.float64)
    below = x
    for layer in range(h.shape[0]):
        h_new[layer] = layer_fn(params, layer, below, np.asarray(h[layer], np.float64))
        below = h_new[layer]
    z = float(below @ params["head.W_hq"][:, 0] + params["head.b_q"][0])
    score = 1.0 / (1.0 + np.exp(-z)) if head == "sigmoid" else z
    return h_new, score
