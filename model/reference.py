"""Plain-numpy float64 reference of the SPEC §2 math, one event at a time.

Written to be read beside the spec, not to be fast: tests cross-check the Numba kernels
against it, and the kernel benchmark uses it as its baseline.
"""

from __future__ import annotations

import numpy as np


def reference_step(
    params: dict[str, np.ndarray],
    h: np.ndarray,
    type_idx: int,
    features: np.ndarray,
    head: str,
) -> tuple[np.ndarray, float]:
    """Return (new h (L, H), score) after one event, given the artifact's arrays by name."""
    L = h.shape[0]
    x = np.concatenate([params["embedding"][type_idx], features]).astype(np.float64)
    h_new = np.empty_like(h, dtype=np.float64)
    below = x
    for layer in range(L):
        W_xh = params[f"layer{layer}.W_xh"].astype(np.float64)
        W_hh = params[f"layer{layer}.W_hh"].astype(np.float64)
        b_h = params[f"layer{layer}.b_h"].astype(np.float64)
        h_new[layer] = np.tanh(below @ W_xh + h[layer] @ W_hh + b_h)
        below = h_new[layer]
    z = float(below @ params["head.W_hq"][:, 0] + params["head.b_q"][0])
    score = 1.0 / (1.0 + np.exp(-z)) if head == "sigmoid" else z
    return h_new, score
