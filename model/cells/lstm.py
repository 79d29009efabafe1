"""The LSTM's batch kernel, PyTorch's nn.LSTM in row vectors; a layer's state row is [h | c]
(float64 form: model/reference.py, lstm_layer)."""

from __future__ import annotations

import numba as nb

from model.cells.ops import JIT, rows_times, score, sigmoid, tanh


@nb.njit(**JIT)
def lstm_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start):
    _, _, type_in, W_fh, W_h0, W_up, b_x, _, _, _, block, W_h0_blocks, W_up_blocks = w
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
        rows_times(P, W_h0, Z, m, H, block, W_h0_blocks)
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
                rows_times(G, W_up[layer - 1], Z, m, H, block, W_up_blocks[layer - 1])
                for i in range(m):
                    for c in range(4 * H):
                        Z[i, c] += b_x[layer, c]
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    ig = sigmoid(Z[i, j])
                    fg = sigmoid(Z[i, H + j])
                    gg = tanh(Z[i, 2 * H + j])
                    og = sigmoid(Z[i, 3 * H + j])
                    cc = fg * state[s, layer, H + j] + ig * gg
                    v = og * tanh(cc)
                    state[s, layer, H + j] = cc
                    state[s, layer, j] = v
                    G[i, j] = v  # the next layer's input
        for i in range(m):
            scores[order[lo + i]] = score(w, G[i, :H])
