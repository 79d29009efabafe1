"""Elman RNN cell kernels (SPEC §2), compiled by Numba.

Row-vector convention, as in the seeds: for layer l with h^0_t = x_t,

    h^l_t  = tanh(h^{l-1}_t W^l_xh + h^l_{t-1} W^l_hh + b^l_h)
    score_t = head(h^L_t W_hq + b_q)

x_t = [embedding[type_t], features_t], so layer 0's input term splits into a per-type row
(embedding @ W_xh[:D], computed once per model in `cell_weights`) plus features @ W_xh[D:].
That turns the widest product of the step into a table lookup.

Kernels take weights as arguments (a `CellWeights` tuple): globals would be frozen at compile
time and a hot-reloaded model would silently keep the old weights.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np

# error_model="numpy" lets LLVM vectorise divisions (the Python model adds a zero check per
# element); fastmath allows reassociation in the tanh polynomial and the dot products.
_JIT = {"cache": True, "fastmath": True, "error_model": "numpy"}

HEAD_IDENTITY = 0
HEAD_SIGMOID = 1

# Rational approximation of tanh on [-c, c] (odd degree-13 numerator, even degree-6
# denominator), max abs error 3e-7 in float32. libm's tanhf is a scalar call (~40 ns here);
# this vectorises to well under 1 ns per element.
_TANH_CLAMP = np.float32(7.90531110763549805)
_A1 = np.float32(4.89352455891786e-03)
_A3 = np.float32(6.37261928875436e-04)
_A5 = np.float32(1.48572235717979e-05)
_A7 = np.float32(5.12229709037114e-08)
_A9 = np.float32(-8.60467152213735e-11)
_A11 = np.float32(2.00018790482477e-13)
_A13 = np.float32(-2.76076847742355e-16)
_B0 = np.float32(4.89352518554385e-03)
_B2 = np.float32(2.26843463243900e-03)
_B4 = np.float32(1.18534705686654e-04)
_B6 = np.float32(1.19825839466702e-06)


class CellWeights(NamedTuple):
    """A model's parameters laid out for the kernels (float32, C-contiguous)."""

    type_in: np.ndarray  # (V, H) embedding @ W_xh[:D] + b_h of layer 0, one row per type
    W_fh: np.ndarray  # (F, H) rows of layer 0's W_xh that multiply the numeric features
    W_hh0: np.ndarray  # (H, H) layer 0's recurrent weights
    W_up: np.ndarray  # (L-1, 2H, H) layers 1..L-1: [W_xh; W_hh] stacked for one product
    b_up: np.ndarray  # (L-1, H)
    w_q: np.ndarray  # (H,) the head's weights W_hq[:, 0]
    b_q: float
    head: int  # HEAD_IDENTITY or HEAD_SIGMOID


def cell_weights(
    embedding: np.ndarray,
    W_xh: list[np.ndarray],
    W_hh: list[np.ndarray],
    b_h: list[np.ndarray],
    W_hq: np.ndarray,
    b_q: np.ndarray,
    head: str,
) -> CellWeights:
    """Return the kernel layout of an L-layer model given in the artifact's terms."""
    f32 = np.float32
    D = embedding.shape[1]
    H = W_hh[0].shape[0]
    L = len(W_hh)
    type_in = embedding.astype(np.float64) @ W_xh[0][:D].astype(np.float64) + b_h[0]
    W_up = np.zeros((L - 1, 2 * H, H), f32)
    b_up = np.zeros((L - 1, H), f32)
    for layer in range(1, L):
        W_up[layer - 1, :H] = W_xh[layer]
        W_up[layer - 1, H:] = W_hh[layer]
        b_up[layer - 1] = b_h[layer]
    return CellWeights(
        type_in=np.ascontiguousarray(type_in, f32),
        W_fh=np.ascontiguousarray(W_xh[0][D:], f32),
        W_hh0=np.ascontiguousarray(W_hh[0], f32),
        W_up=W_up,
        b_up=b_up,
        w_q=np.ascontiguousarray(W_hq[:, 0], f32),
        b_q=float(b_q[0]),
        head=HEAD_SIGMOID if head == "sigmoid" else HEAD_IDENTITY,
    )


@nb.njit(**_JIT)
def _tanh(x):
    x = x if x < _TANH_CLAMP else _TANH_CLAMP
    x = x if x > -_TANH_CLAMP else -_TANH_CLAMP
    x2 = x * x
    p = _A13
    p = p * x2 + _A11
    p = p * x2 + _A9
    p = p * x2 + _A7
    p = p * x2 + _A5
    p = p * x2 + _A3
    p = p * x2 + _A1
    q = _B6
    q = q * x2 + _B4
    q = q * x2 + _B2
    q = q * x2 + _B0
    return x * p / q


@nb.njit(**_JIT)
def _apply_head(w, z):
    if w.head == HEAD_SIGMOID:
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-z))
    return z


@nb.njit(**_JIT)
def step_one(w, h, type_idx, x_feat, reset):
    """Advance one user's state h (L, H) by one event in place; return the event's score."""
    L, H = h.shape
    if reset:
        h[:, :] = 0.0
    z = np.empty(H, np.float32)
    for j in range(H):
        acc = w.type_in[type_idx, j]
        for f in range(x_feat.shape[0]):
            acc += x_feat[f] * w.W_fh[f, j]
        for i in range(H):
            acc += h[0, i] * w.W_hh0[i, j]
        z[j] = acc
    for j in range(H):
        h[0, j] = _tanh(z[j])
    for layer in range(1, L):
        W = w.W_up[layer - 1]
        for j in range(H):
            acc = w.b_up[layer - 1, j]
            for i in range(H):
                acc += h[layer - 1, i] * W[i, j] + h[layer, i] * W[H + i, j]
            z[j] = acc
        for j in range(H):
            h[layer, j] = _tanh(z[j])
    out = np.float32(w.b_q)
    for j in range(H):
        out += h[L - 1, j] * w.w_q[j]
    return _apply_head(w, out)


@nb.njit(**_JIT)
def _wave_order(slot, n_slots):
    """Order events into waves: wave k holds each user's k-th event of the batch.

    Returns (order, wave_start): order[wave_start[k]:wave_start[k+1]] are the events of wave
    k in batch order. Events of one wave belong to distinct users, so a wave is one matrix
    product, and applying the waves in turn applies every user's events in order.
    """
    n = slot.shape[0]
    seen = np.zeros(n_slots, np.int64)
    wave = np.empty(n, np.int64)
    n_waves = 0
    for e in range(n):
        s = slot[e]
        wave[e] = seen[s]
        seen[s] += 1
        if seen[s] > n_waves:
            n_waves = seen[s]
    wave_start = np.zeros(n_waves + 1, np.int64)
    for e in range(n):
        wave_start[wave[e] + 1] += 1
    for k in range(n_waves):
        wave_start[k + 1] += wave_start[k]
    fill = wave_start[:-1].copy()
    order = np.empty(n, np.int64)
    for e in range(n):
        order[fill[wave[e]]] = e
        fill[wave[e]] += 1
    return order, wave_start


def work_size(n_events: int, hidden: int) -> int:
    """Elements of float32 scratch `step_batch` needs for a batch of n_events."""
    return 4 * n_events * hidden


@nb.njit(**_JIT)
def step_batch(w, state, slot, type_idx, x_feat, reset, scores, work):
    """Apply a batch of events of many users, in order, with one call.

    state (U, L, H): one row per distinct user of the batch, updated in place to each user's
    state after their last event. Event e belongs to user slot[e], has type row type_idx[e]
    and numeric features x_feat[e] (N, F); reset[e] zeroes the user's state before it (a new
    session). scores (N,) receives one score per event. work is float32 scratch of at least
    `work_size(N, H)` elements, kept by the caller so a batch allocates no large buffers.
    """
    n = slot.shape[0]
    if n == 0:
        return
    U, L, H = state.shape
    F = x_feat.shape[1]
    order, wave_start = _wave_order(slot, U)
    P = work[: n * H].reshape((n, H))  # layer 0: previous states of a wave's users
    Z = work[n * H : 2 * n * H].reshape((n, H))
    G = work[2 * n * H : 4 * n * H].reshape((n, 2 * H))  # layers above: [h below | h previous]
    for k in range(wave_start.shape[0] - 1):
        lo = wave_start[k]
        m = wave_start[k + 1] - lo
        # Layer 0: one product h_prev @ W_hh for the wave, then per row the type's input
        # row, the features, tanh, and the write-back, in one pass over the row.
        for i in range(m):
            e = order[lo + i]
            s = slot[e]
            if reset[e]:
                state[s, :, :] = 0.0
            for j in range(H):
                P[i, j] = state[s, 0, j]
        np.dot(P[:m], w.W_hh0, Z[:m])
        for i in range(m):
            e = order[lo + i]
            s = slot[e]
            t = type_idx[e]
            for j in range(H):
                Z[i, j] += w.type_in[t, j]
            for f in range(F):
                xf = x_feat[e, f]
                for j in range(H):
                    Z[i, j] += xf * w.W_fh[f, j]
            for j in range(H):
                v = _tanh(Z[i, j])
                Z[i, j] = v
                state[s, 0, j] = v
        for layer in range(1, L):
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    G[i, j] = Z[i, j]
                    G[i, H + j] = state[s, layer, j]
            np.dot(G[:m], w.W_up[layer - 1], Z[:m])
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    v = _tanh(Z[i, j] + w.b_up[layer - 1, j])
                    Z[i, j] = v
                    state[s, layer, j] = v
        for i in range(m):
            out = np.float32(w.b_q)
            for j in range(H):
                out += Z[i, j] * w.w_q[j]
            scores[order[lo + i]] = _apply_head(w, out)
