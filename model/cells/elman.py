"""The Elman cell's batch kernel: h' = tanh(x W_xh + h W_hh + b_h) per layer (float64 form:
model/reference.py, rnn_layer)."""

from __future__ import annotations

import numba as nb

from model.cells.ops import JIT, rows_times, score, tanh


@nb.njit(**JIT)
def elman_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start):
    _, _, type_in, W_fh, W_h0, W_up, b_x, _, _, _, block, W_h0_blocks, W_up_blocks = w
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
        rows_times(P, W_h0, Z, m, H, block, W_h0_blocks)
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
                v = tanh(Z[i, j])
                Z[i, j] = v
                state[s, 0, j] = v
        for layer in range(1, L):
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    G[i, j] = Z[i, j]
                    G[i, H + j] = state[s, layer, j]
            rows_times(G, W_up[layer - 1], Z, m, H, block, W_up_blocks[layer - 1])
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    v = tanh(Z[i, j] + b_x[layer, j])
                    Z[i, j] = v
                    state[s, layer, j] = v
        for i in range(m):
            scores[order[lo + i]] = score(w, Z[i])
