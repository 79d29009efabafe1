"""Kernel benchmark: microseconds per event of the batched cell, beside baselines in one run.

    python -m model.benchmarks.kernels [--cells rnn gru lstm] [--hidden 32 64 128]
        [--batch 1 64 1024] [--ensemble K]

Columns: the batched Numba kernel alone (`step_batch`), the full batch path the worker uses
(`ScoringModel.advance`: gaps, features, resets, kernel), the float64 numpy reference one event
at a time, and PyTorch's `nn.RNNCell`, `nn.GRUCell` or `nn.LSTMCell` (+ embedding and linear
head) over the same batch when torch is installed. Medians over repeats; ratios are against the
kernel in the same run, and a last table puts each GRU and LSTM kernel figure beside the Elman
one. With `--ensemble K` it times instead a fold of K members of H units each
(`train --ensemble`): the kernel skipping the zeros between members (blocked), the same
weights multiplied densely, and one member alone.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from model.artifact import Model, state_shape
from model.cells.step import step_batch
from model.ensemble import folded
from model.features import feature_matrix
from model.random_init import random_model
from model.reference import reference_step
from model.scoring import ScoringModel

EVENT_TYPES = ["view", "search", "add_to_cart", "remove_from_cart", "coupon", "checkout"]


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of fn() over `repeats` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _batch_inputs(batch: int, users_per_batch: int, rng: np.random.Generator):
    slot = rng.permutation(np.arange(batch) % users_per_batch).astype(np.int64)
    type_idx = rng.integers(0, len(EVENT_TYPES) + 1, batch).astype(np.int64)
    ts = 1_700_000_000_000 + np.cumsum(rng.integers(1, 60_000, batch)).astype(np.int64)
    return slot, type_idx, ts


def kernel_us(sm: ScoringModel, batch: int, users: int, repeats: int, rng) -> float:
    """µs/event of the bare batched kernel."""
    slot, type_idx, _ = _batch_inputs(batch, users, rng)
    state = rng.uniform(-0.5, 0.5, (users, *sm.state_shape)).astype(np.float32)
    x_feat = feature_matrix(sm.model.meta.features, rng.uniform(0, 600, batch))
    reset = np.zeros(batch, np.bool_)
    scores = np.empty(batch, np.float32)
    work = sm.scratch(batch)
    t = median_seconds(
        lambda: step_batch(sm.kernel_weights, state, slot, type_idx, x_feat, reset, scores, work),
        repeats,
    )
    return t / batch * 1e6


def advance_us(sm: ScoringModel, batch: int, users: int, repeats: int, rng) -> float:
    """µs/event of the worker's batch path (features, resets, kernel)."""
    slot, type_idx, ts = _batch_inputs(batch, users, rng)
    state = rng.uniform(-0.5, 0.5, (users, *sm.state_shape)).astype(np.float32)

    def run():
        sm.advance(state, np.full(users, -1, np.int64), slot, type_idx, ts)

    return median_seconds(run, repeats) / batch * 1e6


def numpy_reference_us(model: Model, n_events: int, rng) -> float:
    """µs/event of the float64 numpy reference, one event at a time."""
    params = model.arrays
    F = len(model.meta.features)
    h = np.zeros(state_shape(model.meta))
    types = rng.integers(0, len(EVENT_TYPES) + 1, n_events)
    feats = rng.uniform(0, 5, (n_events, F))

    def run():
        hh = h
        for e in range(n_events):
            hh, _ = reference_step(params, hh, int(types[e]), feats[e], model.meta.head)

    return median_seconds(run, 5) / n_events * 1e6


def torch_cell_us(model: Model, batch: int, repeats: int, rng) -> float | None:
    """µs/event of PyTorch nn.RNNCell / nn.GRUCell / nn.LSTMCell over one batch of distinct
    users, or None without torch (random weights: the speed does not depend on them)."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(os.cpu_count() or 1)
    a = model.arrays
    H, D = model.meta.hidden, model.embedding_dim
    F = len(model.meta.features)
    emb = torch.nn.Embedding.from_pretrained(torch.tensor(a["embedding"], dtype=torch.float32))
    make = {"gru": torch.nn.GRUCell, "lstm": torch.nn.LSTMCell}.get(
        model.meta.cell, torch.nn.RNNCell
    )
    cells = [make(D + F if layer == 0 else H, H) for layer in range(model.meta.layers)]
    head = torch.nn.Linear(H, 1)
    types = torch.tensor(rng.integers(0, len(EVENT_TYPES) + 1, batch))
    feats = torch.tensor(rng.uniform(0, 5, (batch, F)), dtype=torch.float32)
    lstm = model.meta.cell == "lstm"
    hs = [(torch.zeros(batch, H), torch.zeros(batch, H)) if lstm else torch.zeros(batch, H)
          for _ in cells]  # fmt: skip

    def run():
        with torch.inference_mode():
            x = torch.cat([emb(types), feats], dim=1)
            for layer, cell in enumerate(cells):
                hs[layer] = cell(x, hs[layer])
                x = hs[layer][0] if lstm else hs[layer]
            torch.sigmoid(head(x))

    return median_seconds(run, repeats) / batch * 1e6


def ensemble_table(args: argparse.Namespace, rng: np.random.Generator) -> None:
    """Print the kernel's µs/event for a fold of args.ensemble members: blocked, dense, one."""
    K = args.ensemble
    print(f"a fold of {K} members of H units (kernel alone, distinct users); µs per event\n")
    header = (
        f"{'cell':>4} {'H':>4} {'batch':>6} {'blocked':>8} {'dense':>8} {'one':>8} {'x dense':>8}"
    )
    print(header)
    print("-" * len(header))
    for cell in args.cells:
        for H in args.hidden:
            members = [
                random_model(EVENT_TYPES, hidden=H, layers=args.layers, features=["gap"],
                             embedding_dim=16, cell=cell, seed=k)
                for k in range(K)
            ]  # fmt: skip
            fold = folded(members)
            one, blocked, dense = ScoringModel(members[0]), ScoringModel(fold), ScoringModel(fold)
            dense.kernel_weights = tuple(dense.weights._replace(block=H * K))
            for batch in args.batch:
                us = [
                    kernel_us(sm, batch, batch, args.repeats, rng) for sm in (blocked, dense, one)
                ]
                print(f"{cell:>4} {H:>4} {batch:>6} {us[0]:8.3f} {us[1]:8.3f} {us[2]:8.3f} "
                      f"{us[1] / us[0]:8.2f}")  # fmt: skip


def machine_line() -> str:
    """One line naming the machine the figures come from."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}"
    )


def main(argv: list[str] | None = None) -> None:
    """Print the kernel benchmark table."""
    p = argparse.ArgumentParser(
        prog="python -m model.benchmarks.kernels", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--cells", nargs="+", choices=["rnn", "gru", "lstm"], default=["rnn", "gru", "lstm"]
    )
    p.add_argument("--hidden", type=int, nargs="+", default=[32, 64, 128])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 1024])
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ensemble",
        type=int,
        default=0,
        metavar="K",
        help="time a fold of K members instead (blocked, dense, one member)",
    )
    args = p.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"machine: {machine_line()}")
    if args.ensemble > 1:
        ensemble_table(args, rng)
        return
    print(f"layers={args.layers}, embedding 16, features [gap]; µs per event, median\n")
    header = (
        f"{'cell':>4} {'H':>4} {'batch':>6} {'users':>6} {'kernel':>8} {'advance':>8} "
        f"{'numpy':>8} {'torch':>8} {'x numpy':>8} {'x torch':>8}"
    )
    print(header)
    print("-" * len(header))
    kernels: dict[tuple, float] = {}
    for cell in args.cells:
        for H in args.hidden:
            model = random_model(EVENT_TYPES, hidden=H, layers=args.layers, features=["gap"],
                                 embedding_dim=16, cell=cell)  # fmt: skip
            sm = ScoringModel(model)
            sm.warm_up()
            ref = numpy_reference_us(model, 200, rng)
            for batch in args.batch:
                for users in sorted({batch, max(1, batch // 16)}, reverse=True):
                    k = kernels[cell, H, batch, users] = kernel_us(
                        sm, batch, users, args.repeats, rng
                    )
                    adv = advance_us(sm, batch, users, args.repeats, rng)
                    tor = torch_cell_us(model, batch, args.repeats, rng) if users == batch else None
                    tor_s = f"{tor:8.3f}" if tor is not None else f"{'-':>8}"
                    x_tor = f"{tor / k:8.1f}" if tor is not None else f"{'-':>8}"
                    print(
                        f"{cell:>4} {H:>4} {batch:>6} {users:>6} {k:8.3f} {adv:8.3f} "
                        f"{ref:8.2f} {tor_s} {ref / k:8.1f} {x_tor}"
                    )
    for gated in ("gru", "lstm"):
        if not {"rnn", gated} <= set(args.cells):
            continue
        print(f"\n{gated.upper()} kernel / Elman kernel, same run:")
        for (cell, H, batch, users), k in kernels.items():
            if cell == gated:
                print(f"  H {H:>4} batch {batch:>5} users {users:>5}: "
                      f"{k / kernels['rnn', H, batch, users]:5.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
