"""Block-diagonal recurrent weights: a folded ensemble (model/ensemble.py) is one model of
K·H units whose members never read each other's units, so its recurrent weights are zero
between blocks. The products then multiply each block alone, from its own contiguous copy:
K times one member's work instead of K² (a dense product of the fold).

A row's sums run over the same terms in the same order as the dense product, less the exact
zeros, so the scores are the same bits (tests/test_ensemble.py)."""

from __future__ import annotations

import numba as nb
import numpy as np


def recurrent_blocks(W_h0: np.ndarray, W_up: np.ndarray) -> dict:
    """The kernels' `block`, `W_h0_blocks` and `W_up_blocks` of float32 recurrent weights:
    the finest blocks they are diagonal in, or H and empty arrays when they are dense."""
    H, cols = W_h0.shape
    block = block_width(W_h0, W_up)
    if block == H:
        return {"block": H, "W_h0_blocks": np.zeros((0, 0, 0), np.float32),
                "W_up_blocks": np.zeros((W_up.shape[0], 0, 0, 0), np.float32)}  # fmt: skip
    up = [diagonal_blocks(W, H, block) for W in W_up]
    n, width = H // block, cols // H * block
    return {
        "block": block,
        "W_h0_blocks": diagonal_blocks(W_h0, H, block),
        "W_up_blocks": np.stack(up) if up else np.zeros((0, n, 2 * block, width), np.float32),
    }


def block_width(W_h0: np.ndarray, W_up: np.ndarray) -> int:
    """The fewest units per block (a divisor of H) for which every recurrent weight between
    two blocks is exactly 0, gates alike; H when there is no such structure."""
    H = W_h0.shape[0]
    gates = W_h0.shape[1] // H
    for width in range(1, H):
        if H % width == 0 and _is_block_diagonal(W_h0, W_up, H, gates, width):
            return width
    return H


def _is_block_diagonal(W_h0, W_up, H: int, gates: int, width: int) -> bool:
    unit = np.arange(H) // width  # each unit's block
    same = unit[:, None] == np.tile(unit, gates)[None, :]  # (H, gates·H): within a block
    return not W_h0[~same].any() and all(
        not W_up[layer, half * H : (half + 1) * H][~same].any()
        for layer in range(W_up.shape[0]) for half in (0, 1)
    )  # fmt: skip


def diagonal_blocks(W: np.ndarray, H: int, block: int) -> np.ndarray:
    """(H / block, rows, gates·block) the diagonal blocks of W (R·H, gates·H), contiguous:
    block b's rows are its units in each of the R row groups, its columns its units in each
    gate, both in W's order."""
    units = np.arange(H).reshape(H // block, block)
    groups, gates = W.shape[0] // H, W.shape[1] // H
    out = [
        W[np.ix_(np.concatenate([g * H + u for g in range(groups)]),
                 np.concatenate([g * H + u for g in range(gates)]))]
        for u in units
    ]  # fmt: skip
    return np.ascontiguousarray(np.stack(out), dtype=np.float32)


@nb.njit(cache=True, error_model="numpy")  # no fastmath: the dense product's order, exactly
def block_rows_times(A, out, m, H, block, W_blocks):
    """out[:m] = A[:m] @ W for W block diagonal, from its blocks (diagonal_blocks): each
    block's row summed into a contiguous scratch row (which vectorises), then put in place."""
    n_blocks, rows, cols = W_blocks.shape
    acc = np.empty(cols, np.float32)
    for i in range(m):
        for b in range(n_blocks):
            for j in range(cols):
                acc[j] = 0.0
            for r in range(rows):
                a = A[i, (r // block) * H + b * block + r % block]
                for j in range(cols):
                    acc[j] += a * W_blocks[b, r, j]
            for g in range(cols // block):
                for j in range(block):
                    out[i, g * H + b * block + j] = acc[g * block + j]
