"""The float64 training kernels, compiled before the suite's workers start (scripts/test.sh).

The gradient checks (test_training, test_train_inputs, test_conformance) run the training's
loss and gradients in float64, a signature neither training (float32) nor evaluation (float64,
forward only) compiles: ~25 s of CPU. Left to the tests, each of the three files' workers
compiled it when they ran at once, before any had written Numba's cache.

    python -m tests.kernels
"""

from __future__ import annotations

import numpy as np

from model.random_init import random_model
from model.training.bptt import loss_and_gradients
from model.training.sessions import Session, pad


def main() -> None:
    model = random_model(["a", "b"], hidden=4, features=["gap"], embedding_dim=2, seed=0)
    params = {k: v.astype(np.float64) for k, v in model.arrays.items()}
    batch = pad([Session("u", np.array([0, 1, 2]), np.zeros((3, 1)), 1.0)], 1)
    loss_and_gradients(params, batch, bptt=2)


if __name__ == "__main__":
    main()
