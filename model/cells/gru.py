"""The GRU's batch kernel, PyTorch's nn.GRU in row vectors (float64 form: model/reference.py,
gru_layer)."""

from __future__ import annotations

import numba as nb

from model.cells.ops import JIT, input_row, rows_times, score, sigmoid, tanh


@nb.njit(**JIT)
def gru_batch(w, state, slot, type_idx, x_feat, reset, scores, work, order, wave_start):
    _, _, type_in, W_fh, W_h0, W_up, b_x, b_hn, _, _, block, W_h0_blocks, W_up_blocks = w
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
            input_row(type_in, W_fh, type_idx[e], x_feat[e], Zx[i])
        for layer in range(L):
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    P[i, j] = state[s, layer, j]
            # one product per gate group: all three gates' recurrent (and input) terms
            if layer == 0:
                rows_times(P, W_h0, Zh, m, H, block, W_h0_blocks)
            else:
                rows_times(
                    B, W_up[layer - 1, :H], Zx, m, H, block, W_up_blocks[layer - 1, :, :block]
                )
                rows_times(
                    P, W_up[layer - 1, H:], Zh, m, H, block, W_up_blocks[layer - 1, :, block:]
                )
                for i in range(m):
                    for c in range(3 * H):
                        Zx[i, c] += b_x[layer, c]
            for i in range(m):
                s = slot[order[lo + i]]
                for j in range(H):
                    r = sigmoid(Zx[i, j] + Zh[i, j])
                    z = sigmoid(Zx[i, H + j] + Zh[i, H + j])
                    nn = tanh(Zx[i, 2 * H + j] + r * (Zh[i, 2 * H + j] + b_hn[layer, j]))
                    v = nn + z * (P[i, j] - nn)
                    B[i, j] = v
                    state[s, layer, j] = v
        for i in range(m):
            scores[order[lo + i]] = score(w, B[i])
