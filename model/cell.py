"""Recurrent cell kernels (docs/contract.md, The model), compiled by Numba: the Elman cell,
the GRU and the LSTM.

Row-vector convention, as in the tutorials the model comes from (docs/contract.md, The
model): for layer l with h^0_t = x_t,

    Elman:  h^l_t = tanh(h^{l-1}_t W^l_xh + h^l_{t-1} W^l_hh + b^l_h)
    GRU:    r = sig(x W_xr + h W_hr + b_r)    z = sig(x W_xz + h W_hz + b_z)
            n = tanh(x W_xn + b_xn + r ⊙ (h W_hn + b_hn))    h' = (1 - z) ⊙ n + z ⊙ h
    LSTM:   i = sig(x W_xi + h W_hi + b_i)    f = sig(x W_xf + h W_hf + b_f)
            g = tanh(x W_xg + h W_hg + b_g)   o = sig(x W_xo + h W_ho + b_o)
            c' = f ⊙ c + i ⊙ g    h' = o ⊙ tanh(c')
    score_t = head(h^L_t W_hq + b_q)

(x is the layer's input, h its previous state, sig the logistic function: PyTorch's nn.GRU
and nn.LSTM, transposed.) A user's state is (L, H), (L, 2H) for the LSTM: each layer's h,
then its c; the next layer and the head read h. The kernels read the packed layout of
model/params.py, where a layer's gates sit side by side in columns, so a wave's recurrent term
is one product per layer whatever the cell.
x_t = [embedding[type_t], features_t, extra_t] (extra_t: a format 2 model's declared inputs,
model/inputs.py), so layer 0's input term splits into a per-type row (embedding @ W_x0[:D] +
b_x[0], computed once per model in `cell_weights`) plus x_feat @ W_x0[D:], x_feat being the
features and the inputs' block side by side: the widest product of the step becomes a table
lookup.

Kernels take weights as arguments (a `CellWeights` tuple): globals would be frozen at compile
time and a hot-reloaded model would silently keep the old weights.
"""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np

from model.params import CELL_GRU, CELL_LSTM, GATES, Params

# error_model="numpy" lets LLVM vectorise divisions (the Python model adds a zero check per
# element); fastmath allows reassociation in the tanh polynomial and the per-row sums (each
# row's own: a row's bits never depend on the other rows of its wave, see _rows_times).
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
    """A packed model (model/params.py, float32) as the kernels read it.

    The recurrent arrays are the packed ones; layer 0's input weights are replaced by the
    per-type table and the feature rows. Kernels unpack it by position, so `tuple(weights)`
    works as well: Numba unboxes a plain tuple on its C fast path, a NamedTuple through
    Python (about 0.5 µs more per call, which is the whole cost of a one-event batch).
    """

    cell: int  # CELL_RNN, CELL_GRU or CELL_LSTM
    head: int  # HEAD_IDENTITY or HEAD_SIGMOID
    type_in: np.ndarray  # (V, G·H) E @ W_x0[:D] + b_x[0]: layer 0's input term per type
    W_fh: np.ndarray  # (F + input width, G·H) W_x0[D:]: the rows of x_feat (features, inputs)
    W_h0: np.ndarray  # (H, G·H)
    W_up: np.ndarray  # (L-1, 2H, G·H)
    b_x: np.ndarray  # (L, G·H)
    b_hn: np.ndarray  # (L, H)
    w_q: np.ndarray  # (H,)
    b_q: np.ndarray  # (1,)


def cell_weights(params: Params, head: str) -> CellWeights:
    """The kernels' view of a packed model (any float dtype; the kernels run in float32)."""
    p = params.astype(np.float32)
    D = p.E.shape[1]
    type_in = params.E.astype(np.float64) @ params.W_x0[:D].astype(np.float64) + params.b_x[0]
    return CellWeights(
        cell=p.cell,
        head=HEAD_SIGMOID if head == "sigmoid" else HEAD_IDENTITY,
        type_in=np.ascontiguousarray(type_in, np.float32),
        W_fh=np.ascontiguousarray(p.W_x0[D:]),
        W_h0=p.W_h0,
        W_up=p.W_up,
        b_x=p.b_x,
        b_hn=p.b_hn,
        w_q=p.w_q,
        b_q=p.b_q,
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
def _sigmoid(x):
    # sigmoid(x) = (1 + tanh(x/2)) / 2: the vectorisable tanh, max abs error 1.5e-7
    return np.float32(0.5) + np.float32(0.5) * _tanh(np.float32(0.5) * x)


@nb.njit(**_JIT)
def _score(w, h_top):
    """head(h_top W_hq + b_q) for one state row."""
    _, head, _, _, _, _, _, _, w_q, b_q = w
    out = b_q[0]
    for j in range(h_top.shape[0]):
        out += h_top[j] * w_q[j]
    if head == HEAD_SIGMOID:
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-out))
    return out


@nb.njit(cache=True, error_model="numpy")  # no fastmath: one rounding per step, as written
def _rows_times(A, W, out, m):
    """out[:m] = A[:m] @ W, each row summed in one fixed order. Not BLAS: it picks its
    kernels by the matrix's shape, so a row's last bits would depend on how many other users
    share its wave, and one event's score (and its reasons) on how the events were batched."""
    K, N = W.shape
    for i in range(m):
        for j in range(N):
            out[i, j] = 0.0
        for k in range(K):
            a = A[i, k]
            for j in range(N):
                out[i, j] += a * W[k, j]


@nb.njit(**_JIT)
def _input_row(type_in, W_fh, type_idx, x_feat, out):
    """Layer 0's input term of one event: its type's row plus features @ W_fh."""
    for c in range(out.shape[0]):
        out[c] = type_in[type_idx, c]
    for f in range(x_feat.shape[0]):
        xf = x_feat[f]
        for c in range(out.shape[0]):
            out[c] += xf * W_fh[f, c]


@nb.njit(**_JIT)
def step_one(w, h, type_idx, x_feat, reset):
    """Advance one user's state h (L, H), (L, 2H) for an LSTM, by one event in place; return
    the event's score."""
    cell, _, type_in, W_fh, W_h0, W_up, b_x, b_hn, _, _ = w
    L = h.shape[0]
    H = W_h0.shape[0]
    GH = type_in.shape[1]
    if reset:
        h[:, :] = 0.0
    zx = np.empty(GH, np.float32)
    zh = np.empty(GH, np.float32)
    _input_row(type_in, W_fh, type_idx, x_feat, zx)
    for layer in range(L):
        if layer == 0:
            Wh = W_h0
        else:
            Wx = W_up[layer - 1, :H]
            Wh = W_up[layer - 1, H:]
            for c in range(GH):
                acc = b_x[layer, c]
                for i in range(H):
                    acc += h[layer - 1, i] * Wx[i, c]
                zx[c] = acc
        for c in range(GH):
            acc = np.float32(0.0)
            for i in range(H):
                acc += h[layer, i] * Wh[i, c]
            zh[c] = acc
        if cell == CELL_GRU:
            for j in range(H):
                r = _sigmoid(zx[j] + zh[j])
                z = _sigmoid(zx[H + j] + zh[H + j])
                n = _tanh(zx[2 * H + j] + r * (zh[2 * H + j] + b_hn[layer, j]))
                h[layer, j] = n + z * (h[layer, j] - n)
        elif cell == CELL_LSTM:
            for j in range(H):
                ig = _sigmoid(zx[j] + zh[j])
                fg = _sigmoid(zx[H + j] + zh[H + j])
                gg = _tanh(zx[2 * H + j] + zh[2 * H + j])
                og = _sigmoid(zx[3 * H + j] + zh[3 * H + j])
                cc = fg * h[layer, H + j] + ig * gg
                h[layer, H + j] = cc
                h[layer, j] = og * _tanh(cc)
        else:
            for j in range(H):
                h[layer, j] = _tanh(zx[j] + zh[j])
    return _score(w, h[L - 1, :H])


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


def work_size(n_events: int, hidden: int, cell: str = "rnn") -> int:
    """Elements of float32 scratch `step_batch` needs for a batch of n_events."""
    return (2 + 2 * GATES[cell]) * n_events * hidden


@nb.njit(**_JIT)
def step_batch(w, state, slot, type_idx, x_feat, reset, scores, work):
    """Apply a batch of events of many users, in order, with one call.

    state (U, L, H), (U, L, 2H) for an LSTM: one row per distinct user of the batch, updated
    in place to each user's state after their last event. Event e belongs to user slot[e], has
    type row type_idx[e] and numeric features x_feat[e] (N, F); reset[e] zeroes the user's
    state before it (a new session). scores (N,) receives one score per event. work is float32
    scratch of at least `work_size(N, H, cell)` elements, kept by the caller so a batch
    allocates no large buffers.
    """
    if slot.shape[0] == 0:
        return
    order, wave_start = _wave_order(slot, state.shape[0])
    if w[0] == CELL_GRU:
        _gru_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start)
    elif w[0] == CELL_LSTM:
        _lstm_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start)
    else:
        _rnn_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start)


@nb.njit(**_JIT)
def _rnn_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start):
    _, _, type_in, W_fh, W_h0, W_up, b_x, _, _, _ = w
    n = slot.shape[0]
    _, L, H = state.shape
    F = x_feat.shape[1]
    P = work[: n * H].reshape((n, H))  # layer 0: previous states of a wave's users
    Z = work[n * H : 2 * n * H].reshape((n, H))
    G = work[2 * n * H : 4 * n * H].reshape((n, 2 * H))  # layers above: [h below | h previous]
    for k in range(wave_start.shape[0] - 1):
        lo = wave_start[k]
        m = wave_start[k + 1] - lo
        # Layer 0: one product h_prev @ W_h0 for the wave, then per row the type's input
        # row, the features, tanh, and the write-back, in one pass over the row.
        for i in range(m):
            e = order[lo + i]
            s = slot[e]
            if reset[e]:
                state[s, :, :] = 0.0
            for j in range(H):
                P[i, j] = state[s, 0, j]
        _rows_times(P, W_h0, Z, m)
        for i in range(m):
            e = order[lo + i]
            s = slot[e]
            t = type_idx[e]
            for j in range(H):
                Z[i, j] += type_in[t, j]
            for f in range(F):
                xf = x_feat[e, f]
                for j in range(H):
                    Z[i, j] += xf * W_fh[f, j]
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
            _rows_times(G, W_up[layer - 1], Z, m)
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    v = _tanh(Z[i, j] + b_x[layer, j])
                    Z[i, j] = v
                    state[s, layer, j] = v
        for i in range(m):
            scores[order[lo + i]] = _score(w, Z[i])


@nb.njit(**_JIT)
def _gru_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start):
    _, _, type_in, W_fh, W_h0, W_up, b_x, b_hn, _, _ = w
    n = slot.shape[0]
    _, L, H = state.shape
    P = work[: n * H].reshape((n, H))  # a layer's previous states of the wave's users
    B = work[n * H : 2 * n * H].reshape((n, H))  # a layer's new states: the next one's input
    Zx = work[2 * n * H : 5 * n * H].reshape((n, 3 * H))  # input term, gates r | z | n
    Zh = work[5 * n * H : 8 * n * H].reshape((n, 3 * H))  # recurrent term, gates r | z | n
    for k in range(wave_start.shape[0] - 1):
        lo = wave_start[k]
        m = wave_start[k + 1] - lo
        for i in range(m):
            e = order[lo + i]
            if reset[e]:
                state[slot[e], :, :] = 0.0
            _input_row(type_in, W_fh, type_idx[e], x_feat[e], Zx[i])
        for layer in range(L):
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    P[i, j] = state[s, layer, j]
            # one product per gate group: all three gates' recurrent (and input) terms
            if layer == 0:
                _rows_times(P, W_h0, Zh, m)
            else:
                _rows_times(B, W_up[layer - 1, :H], Zx, m)
                _rows_times(P, W_up[layer - 1, H:], Zh, m)
                for i in range(m):
                    for c in range(3 * H):
                        Zx[i, c] += b_x[layer, c]
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    r = _sigmoid(Zx[i, j] + Zh[i, j])
                    z = _sigmoid(Zx[i, H + j] + Zh[i, H + j])
                    nn = _tanh(Zx[i, 2 * H + j] + r * (Zh[i, 2 * H + j] + b_hn[layer, j]))
                    v = nn + z * (P[i, j] - nn)
                    B[i, j] = v
                    state[s, layer, j] = v
        for i in range(m):
            scores[order[lo + i]] = _score(w, B[i])


@nb.njit(**_JIT)
def _lstm_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start):
    _, _, type_in, W_fh, W_h0, W_up, b_x, _, _, _ = w
    n = slot.shape[0]
    L = state.shape[1]
    H = W_h0.shape[0]  # state rows are [h | c], 2H wide
    F = x_feat.shape[1]
    P = work[: n * H].reshape((n, H))  # layer 0: previous h of the wave's users
    G = work[n * H : 3 * n * H].reshape((n, 2 * H))  # layers above: [h below | h previous]
    Z = work[3 * n * H : 7 * n * H].reshape((n, 4 * H))  # all four gates: i | f | g | o
    for k in range(wave_start.shape[0] - 1):
        lo = wave_start[k]
        m = wave_start[k + 1] - lo
        # Layer 0: one product h_prev @ W_h0 for the wave (all four gates), then per row the
        # type's input row (biases included) and the features.
        for i in range(m):
            e = order[lo + i]
            s = slot[e]
            if reset[e]:
                state[s, :, :] = 0.0
            for j in range(H):
                P[i, j] = state[s, 0, j]
        _rows_times(P, W_h0, Z, m)
        for i in range(m):
            e = order[lo + i]
            t = type_idx[e]
            for c in range(4 * H):
                Z[i, c] += type_in[t, c]
            for f in range(F):
                xf = x_feat[e, f]
                for c in range(4 * H):
                    Z[i, c] += xf * W_fh[f, c]
        for layer in range(L):
            if layer > 0:
                # both terms of an upper layer in one product of [h below | h previous]
                for i in range(m):
                    s = slot[order[lo + i]]
                    for j in range(H):
                        G[i, H + j] = state[s, layer, j]
                _rows_times(G, W_up[layer - 1], Z, m)
                for i in range(m):
                    for c in range(4 * H):
                        Z[i, c] += b_x[layer, c]
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    ig = _sigmoid(Z[i, j])
                    fg = _sigmoid(Z[i, H + j])
                    gg = _tanh(Z[i, 2 * H + j])
                    og = _sigmoid(Z[i, 3 * H + j])
                    cc = fg * state[s, layer, H + j] + ig * gg
                    v = og * _tanh(cc)
                    state[s, layer, H + j] = cc
                    state[s, layer, j] = v
                    G[i, j] = v  # the next layer's input
        for i in range(m):
            scores[order[lo + i]] = _score(w, G[i, :H])
