"""What every cell's kernels share: the weights tuple, float32 tanh and sigmoid, the head,
the row-by-row product, a wave's order and the scratch size (the cells: model/cells/)."""

from __future__ import annotations

from typing import NamedTuple

import numba as nb
import numpy as np

from model.cells.blocks import block_rows_times, recurrent_blocks
from model.params import GATES, Params

# error_model="numpy" lets LLVM vectorise divisions (the Python model adds a zero check per
# element); fastmath allows reassociation in the tanh polynomial and the per-row sums (each
# row's own: a row's bits never depend on the other rows of its wave, see _rows_times).
JIT = {"cache": True, "fastmath": True, "error_model": "numpy"}

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
    # Block-diagonal recurrent weights (a folded ensemble's members never read each other's
    # units, model/ensemble.py): units per block (H when dense) and the diagonal blocks,
    # contiguous (model/cells/blocks.py; empty when dense), which the products read instead
    block: int
    W_h0_blocks: np.ndarray  # (H / block, block, G·block)
    W_up_blocks: np.ndarray  # (L-1, H / block, 2·block, G·block)


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
        **recurrent_blocks(p.W_h0, p.W_up),
    )


@nb.njit(**JIT)
def tanh(x):
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


@nb.njit(**JIT)
def sigmoid(x):
    # sigmoid(x) = (1 + tanh(x/2)) / 2: the vectorisable tanh, max abs error 1.5e-7
    return np.float32(0.5) + np.float32(0.5) * tanh(np.float32(0.5) * x)


@nb.njit(**JIT)
def score(w, h_top):
    """head(h_top W_hq + b_q) for one state row."""
    _, head, _, _, _, _, _, _, w_q, b_q, _, _, _ = w
    out = b_q[0]
    for j in range(h_top.shape[0]):
        out += h_top[j] * w_q[j]
    if head == HEAD_SIGMOID:
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-out))
    return out


@nb.njit(**JIT)
def wide_head(z, x_feat, w_f, head):
    """A wide head's scores in place: z (N,) holds each event's deep logit (the kernels run
    with the identity head), then adds x_feat[e] w_f, each row in one fixed order, and
    applies the head (sigmoid or identity) as `score` does."""
    for e in range(z.shape[0]):
        out = z[e]
        for j in range(w_f.shape[0]):
            out += x_feat[e, j] * w_f[j]
        if head == HEAD_SIGMOID:
            out = np.float32(1.0) / (np.float32(1.0) + np.exp(-out))
        z[e] = out


@nb.njit(cache=True, error_model="numpy")  # no fastmath: one rounding per step, as written
def rows_times(A, W, out, m, H, block, W_blocks):
    """out[:m] = A[:m] @ W, each row summed in one fixed order. Not BLAS: it picks its
    kernels by the matrix's shape, so a row's last bits would depend on how many other users
    share its wave, and one event's score (and its reasons) on how the events were batched.
    With `block` < H, W is block diagonal and W_blocks its blocks (model/cells/blocks.py)."""
    if block < H:
        block_rows_times(A, out, m, H, block, W_blocks)
        return
    K, N = W.shape
    for i in range(m):
        for j in range(N):
            out[i, j] = 0.0
        for k in range(K):
            a = A[i, k]
            for j in range(N):
                out[i, j] += a * W[k, j]


@nb.njit(**JIT)
def input_row(type_in, W_fh, type_idx, x_feat, out):
    """Layer 0's input term of one event: its type's row plus features @ W_fh."""
    for c in range(out.shape[0]):
        out[c] = type_in[type_idx, c]
    for f in range(x_feat.shape[0]):
        xf = x_feat[f]
        for c in range(out.shape[0]):
            out[c] += xf * W_fh[f, c]


@nb.njit(**JIT)
def wave_order(slot, n_slots):
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
