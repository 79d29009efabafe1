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

import numba as nb
import numpy as np

from model.cells.elman import elman_batch
from model.cells.gru import gru_batch
from model.cells.lstm import lstm_batch
from model.cells.ops import JIT, input_row, score, sigmoid, tanh, wave_order
from model.params import CELL_GRU, CELL_LSTM


@nb.njit(**JIT)
def step_one(w, h, type_idx, x_feat, reset):
    """Advance one user's state h (L, H), (L, 2H) for an LSTM, by one event in place; return
    the event's score."""
    cell, _, type_in, W_fh, W_h0, W_up, b_x, b_hn, _, _, _, _, _ = w
    L = h.shape[0]
    H = W_h0.shape[0]
    GH = type_in.shape[1]
    if reset:
        h[:, :] = 0.0
    zx = np.empty(GH, np.float32)
    zh = np.empty(GH, np.float32)
    input_row(type_in, W_fh, type_idx, x_feat, zx)
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
                r = sigmoid(zx[j] + zh[j])
                z = sigmoid(zx[H + j] + zh[H + j])
                n = tanh(zx[2 * H + j] + r * (zh[2 * H + j] + b_hn[layer, j]))
                h[layer, j] = n + z * (h[layer, j] - n)
        elif cell == CELL_LSTM:
            for j in range(H):
                ig = sigmoid(zx[j] + zh[j])
                fg = sigmoid(zx[H + j] + zh[H + j])
                gg = tanh(zx[2 * H + j] + zh[2 * H + j])
                og = sigmoid(zx[3 * H + j] + zh[3 * H + j])
                cc = fg * h[layer, H + j] + ig * gg
                h[layer, H + j] = cc
                h[layer, j] = og * tanh(cc)
        else:
            for j in range(H):
                h[layer, j] = tanh(zx[j] + zh[j])
    return score(w, h[L - 1, :H])


@nb.njit(**JIT)
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
    order, wave_start = wave_order(slot, state.shape[0])
    if w[0] == CELL_GRU:
        gru_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start)
    elif w[0] == CELL_LSTM:
        lstm_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start)
    else:
        elman_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start)
