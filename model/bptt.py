"""Truncated backpropagation through time for the Elman cell (SPEC §2, §6), in Numba.

A mini-batch of B sessions, padded to T steps, runs in windows of `bptt` steps: forward
through a window from the state carried over from the previous one (carried without
gradient), then backward through that window only. So a loss at step t reaches inputs at most
`bptt - 1` steps back, as in seed 001's `num_steps` truncation. Gradients of the shared
parameters sum over steps and sessions; the loss is per-step binary cross-entropy on the
sigmoid head, weighted by the mask (0 on padding) and divided by `norm`.

Kernels take float32 (training) or float64 (gradient checks) arrays; `loss_and_gradients`
is the public entry point, in the artifact's array names.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from model.sessions import SessionBatch

# Packed parameter layout for the kernels (see _pack):
#   E (V, D) | W_x0 (D+F, H) | W_xu (L-1, H, H) layers above | W_hh (L, H, H) | b (L, H)
#   w_q (H,) | b_q (1,)


@nb.njit(cache=True)
def _inputs(E, types, feats, t, X):
    """X[i] = [E[types[i, t]], feats[i, t]] for each session i."""
    D = E.shape[1]
    for i in range(types.shape[0]):
        X[i, :D] = E[types[i, t]]
        X[i, D:] = feats[i, t]


@nb.njit(cache=True)
def _step(E, W_x0, W_xu, W_hh, b, X, H_prev, H_new):
    """H_new[l] = tanh(input_l @ W_x + H_prev[l] @ W_hh[l] + b[l]) for every layer."""
    L = W_hh.shape[0]
    for layer in range(L):
        inp = X if layer == 0 else H_new[layer - 1]
        Wx = W_x0 if layer == 0 else W_xu[layer - 1]
        A = np.dot(inp, Wx) + np.dot(H_prev[layer], W_hh[layer]) + b[layer]
        H_new[layer] = np.tanh(A)


@nb.njit(cache=True)
def _forward_backward(E, W_x0, W_xu, W_hh, b, w_q, b_q, types, feats, mask, labels, bptt, norm,
                      gE, gW_x0, gW_xu, gW_hh, gb, gw_q, gb_q):  # fmt: skip
    """Loss of the batch (weighted BCE sum / norm); adds the gradients into the g* arrays."""
    B, T = types.shape
    L, H = b.shape
    D = E.shape[1]
    dt = E.dtype
    carry = np.zeros((L, B, H), dt)
    loss = 0.0
    for s in range(0, T, bptt):
        k = min(bptt, T - s)
        Hs = np.empty((k + 1, L, B, H), dt)
        Xs = np.empty((k, B, W_x0.shape[0]), dt)
        dz = np.zeros((k, B), dt)
        Hs[0] = carry
        for j in range(k):
            _inputs(E, types, feats, s + j, Xs[j])
            _step(E, W_x0, W_xu, W_hh, b, Xs[j], Hs[j], Hs[j + 1])
            z = np.dot(Hs[j + 1, L - 1], w_q) + b_q[0]
            for i in range(B):
                m = mask[i, s + j]
                if m != 0.0:
                    y = labels[i]
                    zi = z[i]
                    # stable BCE on the logit: max(z, 0) - z y + log(1 + exp(-|z|))
                    loss += m * (max(zi, 0.0) - zi * y + np.log1p(np.exp(-abs(zi))))
                    p = 1.0 / (1.0 + np.exp(-zi))
                    dz[j, i] = m * (p - y) / norm
        carry = Hs[k].copy()  # next window starts here, without gradient
        dH_next = np.zeros((L, B, H), dt)  # from step j+1 into the state of step j
        for j in range(k - 1, -1, -1):
            dH_below = np.zeros((B, H), dt)
            for layer in range(L - 1, -1, -1):
                h = Hs[j + 1, layer]
                if layer == L - 1:
                    dH = dH_next[layer] + np.outer(dz[j], w_q)
                    gw_q += np.dot(h.T, dz[j])
                    gb_q[0] += dz[j].sum()
                else:
                    dH = dH_next[layer] + dH_below
                dA = dH - dH * h * h  # tanh'; no float64 scalar, so float32 stays float32
                inp = Xs[j] if layer == 0 else Hs[j + 1, layer - 1]
                Wx = W_x0 if layer == 0 else W_xu[layer - 1]
                if layer == 0:
                    gW_x0 += np.dot(inp.T, dA)
                else:
                    gW_xu[layer - 1] += np.dot(inp.T, dA)
                gW_hh[layer] += np.dot(Hs[j, layer].T, dA)
                gb[layer] += dA.sum(axis=0)
                dH_next[layer] = np.dot(dA, W_hh[layer].T)
                d_inp = np.dot(dA, Wx.T)
                if layer > 0:
                    dH_below = d_inp
                else:
                    # padding comes after a session's last step, so its d_inp is zero
                    for i in range(B):
                        gE[types[i, s + j]] += d_inp[i, :D]
    return loss / norm


@nb.njit(cache=True)
def _predict(E, W_x0, W_xu, W_hh, b, w_q, b_q, types, feats):
    """Sigmoid scores (B, T) of every step, each session from a zero state."""
    B, T = types.shape
    L, H = b.shape
    dt = E.dtype
    Hc = np.zeros((L, B, H), dt)
    Hn = np.empty((L, B, H), dt)
    X = np.empty((B, W_x0.shape[0]), dt)
    P = np.empty((B, T), dt)
    for t in range(T):
        _inputs(E, types, feats, t, X)
        _step(E, W_x0, W_xu, W_hh, b, X, Hc, Hn)
        z = np.dot(Hn[L - 1], w_q) + b_q[0]
        P[:, t] = 1.0 / (1.0 + np.exp(-z))
        Hc, Hn = Hn, Hc
    return P


def _pack(params: dict[str, np.ndarray]):
    """Artifact arrays → the kernels' layout (all in the dtype of `embedding`)."""
    dt = params["embedding"].dtype
    L = sum(1 for k in params if k.endswith(".W_hh"))
    H = params["layer0.W_hh"].shape[0]
    W_xu = np.zeros((L - 1, H, H), dt)
    for layer in range(1, L):
        W_xu[layer - 1] = params[f"layer{layer}.W_xh"]
    return (
        np.ascontiguousarray(params["embedding"], dt),
        np.ascontiguousarray(params["layer0.W_xh"], dt),
        W_xu,
        np.ascontiguousarray(np.stack([params[f"layer{i}.W_hh"] for i in range(L)]), dt),
        np.ascontiguousarray(np.stack([params[f"layer{i}.b_h"] for i in range(L)]), dt),
        np.ascontiguousarray(params["head.W_hq"][:, 0], dt),
        np.ascontiguousarray(params["head.b_q"], dt),
    )


def _unpack(packed, L: int) -> dict[str, np.ndarray]:
    gE, gW_x0, gW_xu, gW_hh, gb, gw_q, gb_q = packed
    out = {"embedding": gE, "layer0.W_xh": gW_x0}
    for layer in range(L):
        if layer:
            out[f"layer{layer}.W_xh"] = gW_xu[layer - 1]
        out[f"layer{layer}.W_hh"] = gW_hh[layer]
        out[f"layer{layer}.b_h"] = gb[layer]
    out["head.W_hq"] = gw_q[:, None]
    out["head.b_q"] = gb_q
    return out


def loss_and_gradients(
    params: dict[str, np.ndarray], batch: SessionBatch, bptt: int = 35
) -> tuple[float, dict[str, np.ndarray]]:
    """Mean per-step BCE of a batch of sessions and its truncated-BPTT gradient.

    `params` are named as the artifact's arrays (embedding, layer{l}.W_xh, layer{l}.W_hh,
    layer{l}.b_h, head.W_hq, head.b_q), all float32 or all float64; the gradients come back
    under the same names and dtype. The loss averages over the batch's real steps (mask
    weights); gradients flow back at most `bptt` steps.
    """
    if bptt < 1:
        raise ValueError("bptt must be >= 1")
    packed = _pack(params)
    dt = packed[0].dtype
    grads = tuple(np.zeros_like(p) for p in packed)
    norm = float(batch.mask.sum()) or 1.0
    loss = _forward_backward(
        *packed,
        batch.types,
        np.ascontiguousarray(batch.features, dt),
        np.ascontiguousarray(batch.mask, dt),
        np.ascontiguousarray(batch.labels, dt),
        bptt,
        norm,
        *grads,
    )
    return float(loss), _unpack(grads, packed[3].shape[0])


def predict(params: dict[str, np.ndarray], batch: SessionBatch) -> np.ndarray:
    """Scores (B, T) of every step of every session (from a zero state); padding included."""
    packed = _pack(params)
    return _predict(*packed, batch.types, np.ascontiguousarray(batch.features, packed[0].dtype))


def clip_global_norm(grads: dict[str, np.ndarray], theta: float) -> float:
    """Scale all gradients by min(1, theta / ||g||₂) in place; return the norm before."""
    norm = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))
    if norm > theta > 0:
        scale = theta / norm
        for g in grads.values():
            g *= scale
    return norm
