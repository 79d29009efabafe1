"""Truncated backpropagation through time for the Elman cell, the GRU and the LSTM, in Numba
(docs/contract.md, The model; Training data and labels).

A mini-batch of B sessions, padded to T steps, runs in windows of `bptt` steps: forward
through a window from the state carried over from the previous one (carried without
gradient), then backward through that window only. So a loss at step t reaches inputs at most
`bptt - 1` steps back (an LSTM carries its cell state c beside h the same way), as in the
truncation of the tutorials' `num_steps` (docs/contract.md,
The model). Gradients of the shared
parameters sum over steps and sessions; the loss is per-step binary cross-entropy on the
sigmoid head, weighted by the mask (0 on padding) and divided by `norm`.

The kernels read and write the packed layout of model/params.py (the one the scoring kernels
read), in float32 (training) or float64 (gradient checks). `loss_and_gradients` and `predict`
also take the artifact's arrays by name.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from model.artifact import cell_of
from model.inputs import Inputs
from model.params import CELL_GRU, CELL_LSTM, Params, pack, unpack
from model.training.sessions import SessionBatch


@nb.njit(cache=True)
def _inputs(p, types, feats, buckets, t, X):
    """X[i] = [E[types[i, t]], feats[i, t]] for each session i, with each input table's row
    of bucket buckets[i, t, k] in its columns (model/params.py, tab_at)."""
    D = p.E.shape[1]
    for i in range(types.shape[0]):
        X[i, :D] = p.E[types[i, t]]
        X[i, D:] = feats[i, t]
        for k in range(p.tab_at.shape[0]):
            off, dim, col = p.tab_at[k, 0], p.tab_at[k, 1], p.tab_at[k, 2]
            row = off + buckets[i, t, k] * dim
            X[i, col : col + dim] = p.tab[row : row + dim]


@nb.njit(cache=True)
def _input_tables_backward(p, g, buckets, t, d_x):
    """Scatter-add d_x's embedding columns into the gradients of the rows _inputs took."""
    for i in range(d_x.shape[0]):
        for k in range(p.tab_at.shape[0]):
            off, dim, col = p.tab_at[k, 0], p.tab_at[k, 1], p.tab_at[k, 2]
            row = off + buckets[i, t, k] * dim
            g.tab[row : row + dim] += d_x[i, col : col + dim]


@nb.njit(cache=True)
def _weights(p, layer):
    """(input weights, recurrent weights) of a layer, views into the packed arrays."""
    if layer == 0:
        return p.W_x0, p.W_h0
    H = p.b_hn.shape[1]
    return p.W_up[layer - 1, :H], p.W_up[layer - 1, H:]


@nb.njit(cache=True)
def _layer_forward(p, layer, inp, h_prev, h_out, gates):
    """h_out = the cell on (inp, h_prev); a GRU keeps r, z, n and h W_hn + b_hn in gates."""
    Wx, Wh = _weights(p, layer)
    ax = np.dot(inp, Wx)
    ah = np.dot(h_prev, Wh)
    B, H = h_out.shape
    bx = p.b_x[layer]
    if p.cell == CELL_GRU:
        bhn = p.b_hn[layer]
        for i in range(B):
            for j in range(H):
                r = 1.0 / (1.0 + np.exp(-(ax[i, j] + ah[i, j] + bx[j])))
                z = 1.0 / (1.0 + np.exp(-(ax[i, H + j] + ah[i, H + j] + bx[H + j])))
                hn = ah[i, 2 * H + j] + bhn[j]
                n = np.tanh(ax[i, 2 * H + j] + bx[2 * H + j] + r * hn)
                h_out[i, j] = n + z * (h_prev[i, j] - n)
                gates[i, j] = r
                gates[i, H + j] = z
                gates[i, 2 * H + j] = n
                gates[i, 3 * H + j] = hn
    else:
        for i in range(B):
            for j in range(H):
                h_out[i, j] = np.tanh(ax[i, j] + ah[i, j] + bx[j])


@nb.njit(cache=True)
def _layer_backward(p, g, layer, dh, inp, h_prev, h, gates):
    """Add a layer's step gradients into g; return (d input, d previous state)."""
    Wx, Wh = _weights(p, layer)
    gWx, gWh = _weights(g, layer)
    B, H = dh.shape
    if p.cell == CELL_GRU:
        dAx = np.empty((B, 3 * H), dh.dtype)
        dAh = np.empty((B, 3 * H), dh.dtype)
        direct = np.empty((B, H), dh.dtype)
        for i in range(B):
            for j in range(H):
                r, z = gates[i, j], gates[i, H + j]
                n, hn = gates[i, 2 * H + j], gates[i, 3 * H + j]
                d = dh[i, j]
                dn = d * (1 - z) * (1 - n * n)
                dr = dn * hn * r * (1 - r)
                dz = d * (h_prev[i, j] - n) * z * (1 - z)
                dAx[i, j] = dr
                dAx[i, H + j] = dz
                dAx[i, 2 * H + j] = dn
                dAh[i, j] = dr
                dAh[i, H + j] = dz
                dAh[i, 2 * H + j] = dn * r
                direct[i, j] = d * z
        g.b_hn[layer] += dAh[:, 2 * H :].sum(axis=0)
    else:
        dAx = dh - dh * h * h  # tanh'; no float64 scalar, so float32 stays float32
        dAh = dAx
        direct = np.zeros_like(dh)
    gWx += np.dot(inp.T, dAx)
    gWh += np.dot(h_prev.T, dAh)
    g.b_x[layer] += dAx.sum(axis=0)
    return np.dot(dAx, Wx.T), np.dot(dAh, Wh.T) + direct


@nb.njit(cache=True)
def _lstm_forward(p, layer, inp, h_prev, c_prev, h_out, c_out, gates):
    """(h_out, c_out) = the LSTM on (inp, h_prev, c_prev); gates keeps i, f, g, o, tanh(c')."""
    Wx, Wh = _weights(p, layer)
    a = np.dot(inp, Wx) + np.dot(h_prev, Wh)
    B, H = h_out.shape
    bx = p.b_x[layer]
    for i in range(B):
        for j in range(H):
            ig = 1.0 / (1.0 + np.exp(-(a[i, j] + bx[j])))
            fg = 1.0 / (1.0 + np.exp(-(a[i, H + j] + bx[H + j])))
            gg = np.tanh(a[i, 2 * H + j] + bx[2 * H + j])
            og = 1.0 / (1.0 + np.exp(-(a[i, 3 * H + j] + bx[3 * H + j])))
            c = fg * c_prev[i, j] + ig * gg
            tc = np.tanh(c)
            c_out[i, j] = c
            h_out[i, j] = og * tc
            gates[i, j] = ig
            gates[i, H + j] = fg
            gates[i, 2 * H + j] = gg
            gates[i, 3 * H + j] = og
            gates[i, 4 * H + j] = tc


@nb.njit(cache=True)
def _lstm_backward(p, g, layer, dh, dc, inp, h_prev, c_prev, gates):
    """Add an LSTM layer's step gradients into g; return (d input, d previous h, d previous
    c), given dh and dc, the gradients reaching this step's h' and c'."""
    Wx, Wh = _weights(p, layer)
    gWx, gWh = _weights(g, layer)
    B, H = dh.shape
    dA = np.empty((B, 4 * H), dh.dtype)  # pre-activation gradients, gates i | f | g | o
    dc_prev = np.empty((B, H), dh.dtype)
    for i in range(B):
        for j in range(H):
            ig, fg, gg = gates[i, j], gates[i, H + j], gates[i, 2 * H + j]
            og, tc = gates[i, 3 * H + j], gates[i, 4 * H + j]
            d = dh[i, j]
            dct = dc[i, j] + d * og * (1 - tc * tc)  # everything reaching c'
            dA[i, j] = dct * gg * ig * (1 - ig)
            dA[i, H + j] = dct * c_prev[i, j] * fg * (1 - fg)
            dA[i, 2 * H + j] = dct * ig * (1 - gg * gg)
            dA[i, 3 * H + j] = d * tc * og * (1 - og)
            dc_prev[i, j] = dct * fg
    gWx += np.dot(inp.T, dA)
    gWh += np.dot(h_prev.T, dA)
    g.b_x[layer] += dA.sum(axis=0)
    return np.dot(dA, Wx.T), np.dot(dA, Wh.T), dc_prev


@nb.njit(cache=True)
def _forward_backward(p, g, types, feats, buckets, mask, labels, bptt, norm):
    """Loss of the batch (weighted BCE sum / norm); adds the gradients into g (packed)."""
    B, T = types.shape
    L, H = p.b_hn.shape
    D = p.E.shape[1]
    dt = p.E.dtype
    lstm = p.cell == CELL_LSTM
    n_cache = 4 * H if p.cell == CELL_GRU else (5 * H if lstm else 1)
    wide = p.w_f.shape[0] > 0
    w_x = _over_x(p)
    carry = np.zeros((L, B, H), dt)
    carry_c = np.zeros((L, B, H) if lstm else (1, 1, 1), dt)  # an LSTM's cell states
    loss = 0.0
    for s in range(0, T, bptt):
        k = min(bptt, T - s)
        Hs = np.empty((k + 1, L, B, H), dt)
        Cs = np.empty((k + 1, L, B, H) if lstm else (1, 1, 1, 1), dt)
        Gs = np.empty((k, L, B, n_cache), dt)
        Xs = np.empty((k, B, p.W_x0.shape[0]), dt)
        dz = np.zeros((k, B), dt)
        Hs[0] = carry
        if lstm:
            Cs[0] = carry_c
        for j in range(k):
            _inputs(p, types, feats, buckets, s + j, Xs[j])
            for layer in range(L):
                inp = Xs[j] if layer == 0 else Hs[j + 1, layer - 1]
                if lstm:
                    _lstm_forward(p, layer, inp, Hs[j, layer], Cs[j, layer], Hs[j + 1, layer],
                                  Cs[j + 1, layer], Gs[j, layer])  # fmt: skip
                else:
                    _layer_forward(p, layer, inp, Hs[j, layer], Hs[j + 1, layer], Gs[j, layer])
            z = np.dot(Hs[j + 1, L - 1], p.w_q) + p.b_q[0]
            if wide:
                z += np.dot(Xs[j], w_x)
            for i in range(B):
                m = mask[i, s + j]
                if m != 0.0:
                    y = labels[i]
                    zi = z[i]
                    # stable BCE on the logit: max(z, 0) - z y + log(1 + exp(-|z|))
                    loss += m * (max(zi, 0.0) - zi * y + np.log1p(np.exp(-abs(zi))))
                    q = 1.0 / (1.0 + np.exp(-zi))
                    dz[j, i] = m * (q - y) / norm
        carry = Hs[k].copy()  # next window starts here, without gradient
        if lstm:
            carry_c = Cs[k].copy()
        dH_next = np.zeros((L, B, H), dt)  # from step j+1 into the state of step j
        dC_next = np.zeros((L, B, H) if lstm else (1, 1, 1), dt)  # the same for c (LSTM)
        for j in range(k - 1, -1, -1):
            d_below = np.zeros((B, H), dt)
            for layer in range(L - 1, -1, -1):
                h = Hs[j + 1, layer]
                if layer == L - 1:
                    dh = dH_next[layer] + np.outer(dz[j], p.w_q)
                    g.w_q[:] += np.dot(h.T, dz[j])
                    g.b_q[0] += dz[j].sum()
                    if wide:
                        g.w_f[:] += np.dot(Xs[j].T, dz[j])[D:]
                else:
                    dh = dH_next[layer] + d_below
                inp = Xs[j] if layer == 0 else Hs[j + 1, layer - 1]
                if lstm:
                    d_inp, d_prev, dc_prev = _lstm_backward(
                        p, g, layer, dh, dC_next[layer], inp, Hs[j, layer], Cs[j, layer],
                        Gs[j, layer],
                    )  # fmt: skip
                    dC_next[layer] = dc_prev
                else:
                    d_inp, d_prev = _layer_backward(p, g, layer, dh, inp, Hs[j, layer], h,
                                                    Gs[j, layer])  # fmt: skip
                dH_next[layer] = d_prev
                if layer > 0:
                    d_below = d_inp
                else:
                    # padding comes after a session's last step, so its d_inp is zero
                    for i in range(B):
                        g.E[types[i, s + j]] += d_inp[i, :D]
                    _input_tables_backward(p, g, buckets, s + j, d_inp)
    if wide:
        _without_table_columns(p, g.w_f)
    return loss / norm


@nb.njit(cache=True)
def _over_x(p):
    """The wide part's weights over all of x (0 on the embedding's columns): one contiguous
    product per step."""
    D = p.E.shape[1]
    w = np.zeros(D + p.w_f.shape[0], p.E.dtype)
    w[D:] = p.w_f
    return w


@nb.njit(cache=True)
def _without_table_columns(p, w_f):
    """Zero the wide part's entries of input-table columns: it reads numeric columns only."""
    D = p.E.shape[1]
    for k in range(p.tab_at.shape[0]):
        dim, col = p.tab_at[k, 1], p.tab_at[k, 2]
        w_f[col - D : col - D + dim] = 0.0


@nb.njit(cache=True)
def _predict_logits(p, types, feats, buckets):
    """Head logits (B, T) of every step, each session from a zero state."""
    B, T = types.shape
    L, H = p.b_hn.shape
    dt = p.E.dtype
    lstm = p.cell == CELL_LSTM
    n_cache = 4 * H if p.cell == CELL_GRU else (5 * H if lstm else 1)
    Hc = np.zeros((L, B, H), dt)
    Hn = np.empty((L, B, H), dt)
    Cc = np.zeros((L, B, H) if lstm else (1, 1, 1), dt)  # an LSTM's cell states
    Cn = np.empty((L, B, H) if lstm else (1, 1, 1), dt)
    gates = np.empty((B, n_cache), dt)
    X = np.empty((B, p.W_x0.shape[0]), dt)
    Z = np.empty((B, T), dt)
    w_x = _over_x(p)
    for t in range(T):
        _inputs(p, types, feats, buckets, t, X)
        for layer in range(L):
            inp = X if layer == 0 else Hn[layer - 1]
            if lstm:
                _lstm_forward(p, layer, inp, Hc[layer], Cc[layer], Hn[layer], Cn[layer], gates)
            else:
                _layer_forward(p, layer, inp, Hc[layer], Hn[layer], gates)
        Z[:, t] = np.dot(Hn[L - 1], p.w_q) + p.b_q[0]
        if p.w_f.shape[0] > 0:
            Z[:, t] += np.dot(X, w_x)
        Hc, Hn = Hn, Hc
        Cc, Cn = Cn, Cc
    return Z


def as_params(
    params: dict[str, np.ndarray] | Params, cell: str | None = None, inputs: Inputs | None = None
) -> Params:
    """Packed parameters, from a Params (as is) or the artifact's arrays (in their dtype),
    with the declared `inputs`' tables."""
    if isinstance(params, Params):
        return params
    return pack(params, cell or cell_of(params), params["embedding"].dtype, inputs)


def _buckets(p: Params, batch: SessionBatch) -> np.ndarray:
    """The batch's input table rows, checked against the tables the parameters hold."""
    B, T = batch.types.shape
    buckets = batch.buckets if batch.buckets is not None else np.zeros((B, T, 0), np.int64)
    if buckets.shape[2] != p.tab_at.shape[0]:
        raise ValueError(
            f"the batch has {buckets.shape[2]} input table columns, the model "
            f"{p.tab_at.shape[0]} tables (sessionize with the model's inputs)"
        )
    return np.ascontiguousarray(buckets, np.int64)


def packed_loss_and_gradients(p: Params, batch: SessionBatch, bptt: int = 35):
    """`loss_and_gradients` on the packed layout: (loss, gradients as a Params)."""
    if bptt < 1:
        raise ValueError("bptt must be >= 1")
    dt = p.E.dtype
    g = p.zeros_like()
    norm = float(batch.mask.sum()) or 1.0
    loss = _forward_backward(
        p,
        g,
        batch.types,
        np.ascontiguousarray(batch.features, dt),
        _buckets(p, batch),
        np.ascontiguousarray(batch.mask, dt),
        np.ascontiguousarray(batch.labels, dt),
        bptt,
        norm,
    )
    return float(loss), g


def loss_and_gradients(
    params: dict[str, np.ndarray],
    batch: SessionBatch,
    bptt: int = 35,
    cell: str | None = None,
    inputs: Inputs | None = None,
) -> tuple[float, dict[str, np.ndarray]]:
    """Mean per-step BCE of a batch of sessions and its truncated-BPTT gradient.

    `params` are named as the artifact's arrays (embedding, layer{l}.W_xh, ... or the GRU's
    layer{l}.W_xr, ... or the LSTM's layer{l}.W_xi, ..., head.W_hq, head.b_q), all float32 or
    all float64; the gradients come back under the same names and dtype. The loss averages
    over the batch's real steps (mask weights); gradients flow back at most `bptt` steps.
    A model with declared `inputs` has their tables among params (input.{name}.embedding)
    and gets their gradients too.
    """
    loss, g = packed_loss_and_gradients(as_params(params, cell, inputs), batch, bptt)
    return loss, {k: np.array(v) for k, v in unpack(g, inputs).items()}


def predict(
    params: dict[str, np.ndarray] | Params,
    batch: SessionBatch,
    head: str = "sigmoid",
    cell: str | None = None,
    inputs: Inputs | None = None,
) -> np.ndarray:
    """Scores (B, T) of every step of every session (from a zero state); padding included."""
    p = as_params(params, cell, inputs)
    feats = np.ascontiguousarray(batch.features, p.E.dtype)
    Z = _predict_logits(p, batch.types, feats, _buckets(p, batch))
    return 1.0 / (1.0 + np.exp(-Z)) if head == "sigmoid" else Z


def clip_global_norm(grads: dict[str, np.ndarray], theta: float) -> float:
    """Scale all gradients by min(1, theta / ||g||₂) in place; return the norm before."""
    norm = float(np.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads.values())))
    if norm > theta > 0:
        scale = theta / norm
        for g in grads.values():
            g *= scale
    return norm
