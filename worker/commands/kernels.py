"""Numba kernels compiled ahead of use, in a helper process, while the caller does other work.

Kernels compile on first use and are cached on disk (`cache=True`: `model/__pycache__`), so
only a first run pays. A command compiles only what it calls: the worker and `score` the
scoring kernels, `train` the training and evaluation kernels. The demo needs all three sets;
compiled one after another they take most of its first minute, so it compiles the scoring and
evaluation sets in a second process while it compiles the training set itself.

    python -m worker.commands.kernels scoring evaluation     # compile (or load) these sets now
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import numpy as np

# The model modules are imported inside the functions below, so the helper process
# (`python -m worker.commands.kernels SET ...`) loads only those of the sets it compiles.


def _tiny_model():
    from model.random_init import random_model

    return random_model(["a", "b"], hidden=4, features=["gap"], embedding_dim=2, seed=0)


def _tiny_batch():
    from model.training.sessions import Session, pad

    sessions = [Session("u", np.array([0, 1, 2]), np.zeros((3, 1), np.float32), 1.0)]
    return pad(sessions, 1)


def _compile_scoring() -> None:
    from model.inputs import parse_inputs
    from model.random_init import random_model
    from model.scoring import ScoringModel
    from worker.engine.models import warm_up_worker_kernels

    ScoringModel(_tiny_model()).warm_up()
    # session features (the state's memory rows), an item input and a numeric input's
    # session statistics compile kernels of their own: a shop's model with them starts warm
    declared = parse_inputs([
        {"kind": "numeric", "name": "price", "transform": "log1p", "mean": 0.0, "scale": 1.0,
         "session": True},
        {"kind": "item", "name": "sku", "buckets": 8, "dim": 2},
    ])  # fmt: skip
    rich = random_model(["a", "b"], hidden=4, features=["gap", "session_events"],
                        embedding_dim=2, seed=0, inputs=declared)  # fmt: skip
    ScoringModel(rich).warm_up()
    warm_up_worker_kernels()  # the worker's own kernels beside the model's


def _compile_training() -> None:
    from model.training.bptt import loss_and_gradients

    params = {k: v.astype(np.float32) for k, v in _tiny_model().arrays.items()}
    loss_and_gradients(params, _tiny_batch(), bptt=2)


def _compile_evaluation() -> None:
    from model.training.bptt import predict

    # training evaluates (AUC, ROC) in float64: the signature the cache must hold
    predict({k: v.astype(np.float64) for k, v in _tiny_model().arrays.items()}, _tiny_batch())


COMPILE: dict[str, Callable[[], None]] = {
    "scoring": _compile_scoring,
    "training": _compile_training,
    "evaluation": _compile_evaluation,
}


def _dispatchers(name: str) -> list:
    from model import features
    from model.cells import step
    from model.training import bptt

    return {
        "scoring": [step.step_batch, features.event_gaps],
        "training": [bptt._forward_backward],
        "evaluation": [bptt._predict_logits],
    }[name]


def is_cached(name: str) -> bool:
    """Whether the on-disk cache holds a current compilation of every kernel of the set."""
    try:
        # numba's own index (keyed on the source file's stamp); private, hence the guard
        return all(d._cache._cache_file._load_index() for d in _dispatchers(name))
    except Exception:  # another numba version: assume cold; compiling ahead is then a no-op
        return False


def idle_cores() -> float:
    """Cores this process may use minus the 1-minute load average."""
    try:
        return len(os.sched_getaffinity(0)) - os.getloadavg()[0]
    except (AttributeError, OSError):  # not Linux
        return (os.cpu_count() or 1) - 1.0


def compile_in_background(names: list[str]) -> subprocess.Popen | None:
    """Start a process compiling the sets not cached yet; None when all are cached or no core
    is idle (a second compiler on a busy machine only slows the first one down)."""
    cold = [n for n in names if not is_cached(n)]
    if not cold or idle_cores() < 1:
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "worker.commands.kernels", *cold],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,  # on failure the caller compiles at first use instead
    )


def main(names: list[str]) -> int:
    for name in names:
        COMPILE[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
