"""Training benchmark: this trainer beside PyTorch nn.RNN / nn.GRU / nn.LSTM on the same data.

    python -m model.benchmarks.training [--cell rnn|gru|lstm] [--events 100000] [--users 5000] \
        [--hidden 64]

Both train the same architecture (embedding, one Elman, GRU or LSTM layer, sigmoid head, features
[gap]) on the same mini-batches with the same truncation (bptt windows, state carried
without gradient), Adam at the same learning rate, and clipping at the same global norm
(PyTorch's clip_grad_norm_ divides by norm + 1e-6 and always rescales; ours rescales only
above theta). Prints sessions/s and seconds per epoch, and the validation AUC each reaches.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np
from threadpoolctl import threadpool_limits

from model.benchmarks.kernels import machine_line
from model.data.synthetic import synthetic_events
from model.data.torch_weights import arrays_from_torch
from model.params import pack
from model.random_init import random_model
from model.training.bptt import clip_global_norm, packed_loss_and_gradients
from model.training.config import TrainConfig
from model.training.evaluate import metrics_of, step_scores
from model.training.optim import Adam
from model.training.prepare import prepare
from model.training.sessions import minibatches


def epoch_seconds(config: TrainConfig, train_s, epochs: int, step: Callable) -> list[float]:
    """Seconds of each epoch of step(batch) over the same seeded mini-batches."""
    rng = np.random.default_rng(config.seed)
    times = []
    for _ in range(epochs):
        batches = minibatches(train_s, config.batch_size, len(config.features), rng)
        t0 = time.perf_counter()
        for b in batches:
            step(b)
        times.append(time.perf_counter() - t0)
    return times


def ours(config: TrainConfig, train_s, valid_s, types, epochs: int):
    with threadpool_limits(limits=1, user_api="blas"):  # as `train` runs
        return _ours(config, train_s, valid_s, types, epochs)


def _ours(config: TrainConfig, train_s, valid_s, types, epochs: int):
    F = len(config.features)
    model = random_model(types, config.hidden, 1, config.features, config.embedding_dim,
                         seed=config.seed, cell=config.cell)  # fmt: skip
    params = pack(model.arrays, config.cell, np.float32)  # what `train` does
    opt = Adam(config.lr)

    def step(b):
        _, g = packed_loss_and_gradients(params, b, config.bptt)
        clip_global_norm(g.arrays(), config.clip)
        opt.step(params.arrays(), g.arrays())

    times = epoch_seconds(config, train_s, epochs, step)
    return times, metrics_of(*step_scores(params.astype(np.float64), valid_s, F))["auc_last"]


def pytorch(config: TrainConfig, train_s, valid_s, types, epochs: int):
    import torch

    torch.manual_seed(config.seed)
    torch.set_num_threads(os.cpu_count() or 1)
    F, H, D = len(config.features), config.hidden, config.embedding_dim
    emb = torch.nn.Embedding(len(types) + 1, D)
    if config.cell == "gru":
        rnn = torch.nn.GRU(D + F, H, batch_first=True)
    elif config.cell == "lstm":
        rnn = torch.nn.LSTM(D + F, H, batch_first=True)
    else:
        rnn = torch.nn.RNN(D + F, H, batch_first=True, nonlinearity="tanh")
    head = torch.nn.Linear(H, 1)
    parameters = [*emb.parameters(), *rnn.parameters(), *head.parameters()]
    opt = torch.optim.Adam(parameters, lr=config.lr)

    def step(b):
        types_t = torch.from_numpy(b.types)
        feats = torch.from_numpy(b.features.astype(np.float32))
        mask = torch.from_numpy(b.mask.astype(np.float32))
        y = torch.from_numpy(b.labels.astype(np.float32))[:, None].expand_as(mask)
        h = torch.zeros(1, len(b.labels), H)
        if config.cell == "lstm":
            h = (h, torch.zeros(1, len(b.labels), H))  # h and the cell state c
        opt.zero_grad()
        norm = mask.sum()
        for s in range(0, b.types.shape[1], config.bptt):
            sl = slice(s, s + config.bptt)
            x = torch.cat([emb(types_t[:, sl]), feats[:, sl]], dim=2)
            h = tuple(v.detach() for v in h) if isinstance(h, tuple) else h.detach()
            out, h = rnn(x, h)
            z = head(out)[..., 0]
            loss = (
                torch.nn.functional.binary_cross_entropy_with_logits(
                    z, y[:, sl], weight=mask[:, sl], reduction="sum"
                )
                / norm
            )
            loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, config.clip)
        opt.step()

    times = epoch_seconds(config, train_s, epochs, step)
    state = {"embedding.weight": emb.weight.detach().numpy()}
    state |= {f"rnn.{k}": v.detach().numpy() for k, v in rnn.state_dict().items()}
    state |= {f"head.{k}": v.detach().numpy() for k, v in head.state_dict().items()}
    params = pack(arrays_from_torch(state, config.cell, layers=1), config.cell, np.float64)
    return times, metrics_of(*step_scores(params, valid_s, F))["auc_last"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m model.benchmarks.training", description=__doc__.split("\n")[0]
    )
    p.add_argument("--events", type=int, default=100_000)
    p.add_argument("--users", type=int, default=5_000)
    p.add_argument("--cell", choices=["rnn", "gru", "lstm"], default="rnn")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args(argv)
    config = TrainConfig(
        cell=args.cell, hidden=args.hidden, batch_size=args.batch_size, epochs=args.epochs
    )
    events = list(synthetic_events(args.events, args.users, seed=7))
    types, train_s, valid_s = prepare(events, config)
    print(f"machine: {machine_line()}")
    print(f"{len(train_s)} training sessions ({sum(len(s.types) for s in train_s)} steps), "
          f"{len(valid_s)} validation; cell {args.cell}, H = {args.hidden}, bptt {config.bptt}, "
          f"batch {config.batch_size}, Adam lr {config.lr}, clip {config.clip}\n")  # fmt: skip
    ours(config, train_s[:64], valid_s[:8], types, 1)  # compile / load the kernels first
    rows = [("intentstream (Numba)", *ours(config, train_s, valid_s, types, args.epochs))]
    try:
        torch_name = "PyTorch nn." + {"gru": "GRU", "lstm": "LSTM"}.get(args.cell, "RNN")
        rows.append((torch_name, *pytorch(config, train_s, valid_s, types, args.epochs)))
    except ImportError:
        print("(torch not installed: pip install torch==2.13.0 for the PyTorch row)")
    print(f"{'trainer':<22} {'s/epoch':>8} {'sessions/s':>11} {'val AUC':>8}")
    for name, times, auc in rows:
        med = float(np.median(times))
        print(f"{name:<22} {med:>8.2f} {len(train_s) / med:>11,.0f} {auc:>8.4f}")


if __name__ == "__main__":
    main()
